"""Tool-call parsers: turn model output text into OpenAI ``tool_calls``.

Two formats, chosen with ``--tool-call-parser``:

- ``hermes``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks; any text
  outside the blocks is ``content``.
- ``llama3_json``: Llama 3.1/3.2 JSON calls ``{"name": ..., "parameters": {...}}`` (or
  ``"arguments"``), optionally after ``<|python_tag|>``, several separated by ``;``.

Each parser answers a whole output at once (``extract``) or incrementally (``stream``), and the two
agree: the streamed content pieces join to ``extract``'s content and each call streams the same
name and arguments. A call is only sent once its JSON is complete and valid, because a block that
turns out malformed falls back to content and a sent call cannot be taken back; its arguments then
go out as one piece right after the header. Content never carries part of a tag: text that could
be the start of one is held back until the next characters decide.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import ClassVar


def new_call_id() -> str:
    """A fresh OpenAI-style tool call id: ``call_`` + 24 random hex digits."""
    return "call_" + uuid.uuid4().hex[:24]


@dataclass
class ToolCall:
    """One parsed call; ``arguments`` is the JSON text of the arguments object."""

    name: str
    arguments: str
    id: str = field(default_factory=new_call_id)

    def to_openai(self) -> dict:
        """The ``tool_calls`` entry of a non-streaming chat completion message."""
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class ExtractedToolCalls:
    """A whole output split into plain ``content`` (None if empty) and ``tool_calls``."""

    content: str | None
    tool_calls: list[ToolCall]


def split_partial_tag(text: str, tag: str) -> tuple[str, str]:
    """``(ready, held)``: ``held`` is the longest end of ``text`` that could begin ``tag``."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return text[:-k], text[-k:]
    return text, ""


class StrippedText:
    """Streams text so that the pieces join to ``whole.strip()``.

    Leading whitespace is dropped; trailing whitespace is held until non-space text follows it,
    and dropped if none does.
    """

    def __init__(self) -> None:
        self._started = False
        self._held = ""

    def push(self, text: str) -> str:
        """Take the next text; return what may be sent now."""
        if not self._started:
            text = text.lstrip()
            if not text:
                return ""
            self._started = True
        text = self._held + text
        body = text.rstrip()
        self._held = text[len(body):]
        return body


def call_from_object(obj: object) -> ToolCall | None:
    """A ToolCall from a decoded ``{"name", "arguments" | "parameters"}`` object, else None.

    Arguments given as a JSON string holding an object are accepted (some models quote them).
    """
    if not isinstance(obj, dict):
        return None
    name = obj.get("name")
    args = obj["arguments"] if "arguments" in obj else obj.get("parameters", {})
    if isinstance(args, str):
        args = _loads_or_none(args)
    if not isinstance(name, str) or not name or not isinstance(args, dict):
        return None
    return ToolCall(name=name, arguments=json.dumps(args, ensure_ascii=False))


def _loads_or_none(text: str) -> object | None:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def call_deltas(index: int, call: ToolCall) -> list[dict]:
    """The chunk deltas announcing call ``index``: header (id, name) first, then its arguments."""
    header = {"index": index, "id": call.id, "type": "function",
              "function": {"name": call.name, "arguments": ""}}
    arguments = {"index": index, "function": {"arguments": call.arguments}}
    return [{"tool_calls": [header]}, {"tool_calls": [arguments]}]


class ToolStream:
    """Incremental parser for one generation: ``feed`` text in, get chunk deltas out.

    Subclasses implement ``_consume(final)``, which eats what it can of ``self._buf`` and reports
    it through ``_emit_text`` and ``_emit_call``.
    """

    def __init__(self) -> None:
        self._buf = ""
        self._calls: list[ToolCall] = []
        self._content = StrippedText()
        self._out: list[dict] = []

    def feed(self, delta: str) -> list[dict]:
        """New model text -> the chunk ``delta`` dicts to send now (possibly none)."""
        self._buf += delta
        self._consume(final=False)
        return self._drain()

    def finish(self) -> list[dict]:
        """End of generation: flush held-back text and any final unterminated call."""
        self._consume(final=True)
        return self._drain()

    @property
    def tool_calls(self) -> list[ToolCall]:
        """The calls sent so far, in order (their ids match the streamed headers)."""
        return list(self._calls)

    def _consume(self, final: bool) -> None:
        raise NotImplementedError

    def _emit_text(self, text: str) -> None:
        text = self._content.push(text)
        if not text:
            return
        if self._out and "content" in self._out[-1]:
            self._out[-1]["content"] += text
        else:
            self._out.append({"content": text})

    def _emit_call(self, call: ToolCall) -> None:
        self._out.extend(call_deltas(len(self._calls), call))
        self._calls.append(call)

    def _drain(self) -> list[dict]:
        out, self._out = self._out, []
        return out


class ToolParser:
    """A tool-call format: whole-output ``extract`` and incremental ``stream``."""

    name: ClassVar[str]

    def extract(self, text: str) -> ExtractedToolCalls:
        """Split a whole output into content and tool calls."""
        raise NotImplementedError

    def stream(self) -> ToolStream:
        """A fresh incremental parser for one generation."""
        raise NotImplementedError


# ---------------------------------------------------------------------------------------- hermes

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"


def parse_hermes_block(body: str) -> ToolCall | None:
    """The call in the text between ``<tool_call>`` and ``</tool_call>``, or None if malformed."""
    return call_from_object(_loads_or_none(body))


class HermesToolParser(ToolParser):
    """``<tool_call>{json}</tool_call>`` blocks; the last block may lack its closing tag."""

    name = "hermes"

    def extract(self, text: str) -> ExtractedToolCalls:
        content, calls, pos = [], [], 0
        while (start := text.find(HERMES_OPEN, pos)) >= 0:
            content.append(text[pos:start])
            body_start = start + len(HERMES_OPEN)
            end = text.find(HERMES_CLOSE, body_start)
            pos = len(text) if end < 0 else end + len(HERMES_CLOSE)
            call = parse_hermes_block(text[body_start:len(text) if end < 0 else end])
            if call is None:
                content.append(text[start:pos])  # malformed: the raw block is content
            else:
                calls.append(call)
        content.append(text[pos:])
        return ExtractedToolCalls("".join(content).strip() or None, calls)

    def stream(self) -> HermesToolStream:
        return HermesToolStream()


class HermesToolStream(ToolStream):
    """Outside a block: stream text, holding back a possible ``<tool_call>`` start.
    Inside: buffer until ``</tool_call>`` (or the end), then send the call or, if malformed,
    the raw block as content."""

    def __init__(self) -> None:
        super().__init__()
        self._inside = False
        self._searched = 0  # no HERMES_CLOSE starts before this offset of the open block

    def _consume(self, final: bool) -> None:
        while self._consume_block(final) if self._inside else self._consume_text(final):
            pass

    def _consume_text(self, final: bool) -> bool:
        start = self._buf.find(HERMES_OPEN)
        if start < 0:
            ready, held = (self._buf, "") if final else split_partial_tag(self._buf, HERMES_OPEN)
            self._emit_text(ready)
            self._buf = held
            return False
        self._emit_text(self._buf[:start])
        self._buf = self._buf[start:]
        self._inside, self._searched = True, len(HERMES_OPEN)
        return True

    def _consume_block(self, final: bool) -> bool:
        end = self._buf.find(HERMES_CLOSE, self._searched)
        if end < 0 and not final:
            self._searched = max(len(HERMES_OPEN), len(self._buf) - len(HERMES_CLOSE) + 1)
            return False
        stop = len(self._buf) if end < 0 else end + len(HERMES_CLOSE)
        block, self._buf = self._buf[:stop], self._buf[stop:]
        call = parse_hermes_block(block[len(HERMES_OPEN):len(block) if end < 0 else end])
        if call is None:
            self._emit_text(block)
        else:
            self._emit_call(call)
        self._inside = False
        return True


# ----------------------------------------------------------------------------------- llama3_json

PYTHON_TAG = "<|python_tag|>"


def skip_whitespace(text: str, pos: int) -> int:
    """The first offset at or after ``pos`` that is not whitespace."""
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def parse_json_calls(text: str) -> tuple[list[ToolCall], str]:
    """Leading calls of ``text`` (JSON objects, optionally ``;``-separated) and the rest.

    Stops at the first thing that is not a valid call; that and all after it is returned as rest.
    """
    decoder, calls, sep_allowed = json.JSONDecoder(), [], False
    pos = skip_whitespace(text, 0)
    while pos < len(text):
        if sep_allowed and text[pos] == ";":
            pos, sep_allowed = skip_whitespace(text, pos + 1), False
            continue
        if text[pos] != "{":
            break
        try:
            obj, end = decoder.raw_decode(text, pos)
        except (ValueError, RecursionError):
            break
        if (call := call_from_object(obj)) is None:
            break
        calls.append(call)
        pos, sep_allowed = skip_whitespace(text, end), True
    return calls, text[pos:]


class Llama3JsonToolParser(ToolParser):
    """Llama 3.1/3.2 JSON calls: the output starts with ``{`` or has ``<|python_tag|>``
    before the calls; otherwise it is all content."""

    name = "llama3_json"

    def extract(self, text: str) -> ExtractedToolCalls:
        if text.lstrip().startswith("{"):
            head, calls_text = "", text
        else:
            head, tag, calls_text = text.partition(PYTHON_TAG)
            if not tag:
                return ExtractedToolCalls(text.strip() or None, [])
        calls, rest = parse_json_calls(calls_text)
        return ExtractedToolCalls((head + rest).strip() or None, calls)

    def stream(self) -> Llama3JsonToolStream:
        return Llama3JsonToolStream()


class Llama3JsonToolStream(ToolStream):
    """Modes: ``start`` (decide on the first non-space character), ``text`` (content, watching
    for ``<|python_tag|>``), ``json`` (one complete object at a time), ``rest`` (content after
    something that is not a call)."""

    def __init__(self) -> None:
        super().__init__()
        self._mode = "start"
        self._sep_allowed = False
        self._tried = 0  # the buffer had no decodable object up to here (no "}" since)

    def _consume(self, final: bool) -> None:
        while getattr(self, f"_consume_{self._mode}")(final):
            pass

    def _consume_start(self, final: bool) -> bool:
        head = self._buf.lstrip()
        if not head:
            return False
        self._mode = "json" if head.startswith("{") else "text"
        return True

    def _consume_text(self, final: bool) -> bool:
        head, tag, tail = self._buf.partition(PYTHON_TAG)
        if not tag:
            ready, held = (self._buf, "") if final else split_partial_tag(self._buf, PYTHON_TAG)
            self._emit_text(ready)
            self._buf = held
            return False
        self._emit_text(head)
        self._buf, self._mode = tail, "json"
        return True

    def _consume_rest(self, final: bool) -> bool:
        self._emit_text(self._buf)
        self._buf = ""
        return False

    def _consume_json(self, final: bool) -> bool:
        self._buf = self._buf[skip_whitespace(self._buf, 0):]
        if not self._buf:
            return False
        if self._sep_allowed and self._buf[0] == ";":
            self._buf, self._sep_allowed = self._buf[1:], False
            return True
        if self._buf[0] != "{":
            self._mode = "rest"
            return True
        return self._consume_object(final)

    def _consume_object(self, final: bool) -> bool:
        if "}" not in self._buf[self._tried:] and not final:
            return False  # an object cannot have closed since the last attempt
        self._tried = len(self._buf)
        try:
            obj, end = json.JSONDecoder().raw_decode(self._buf)
        except (ValueError, RecursionError):
            if final:
                self._mode = "rest"
            return final  # incomplete so far, or malformed: wait for more or the end
        if (call := call_from_object(obj)) is None:
            self._mode = "rest"
            return True
        self._emit_call(call)
        self._buf, self._sep_allowed, self._tried = self._buf[end:], True, 0
        return True


# ---------------------------------------------------------------- forced calls (structured output)

class ForcedToolParser(ToolParser):
    """tool_choice ``required`` or a named function: a grammar forced the whole output to be the calls,
    so no tags are looked for. Named: the output is the function's arguments object, returned as written
    (streamed as it comes, as vLLM does; cut short by max_tokens, it is the partial text). Required: a
    JSON array of ``{"name": ..., "parameters": {...}}`` (forced_tool_schema builds both grammars); an
    array cut short by max_tokens still gives its complete calls."""

    name = "forced"

    def __init__(self, function: str | None = None):
        self.function = function  # the named function, or None for required

    def extract(self, text: str) -> ExtractedToolCalls:
        if self.function is not None:
            arguments = text.strip()
            return ExtractedToolCalls(None, [ToolCall(self.function, arguments)] if arguments else [])
        found = [call_from_object(item) for item in complete_array_items(text)]
        calls = found if found and all(found) else []
        return ExtractedToolCalls(None if calls else (text.strip() or None), calls)

    def stream(self) -> "ForcedToolStream":
        return ForcedToolStream(self)


def complete_array_items(text: str) -> list:
    """The items of a JSON array that are complete, even if the array itself was cut short (max_tokens
    ended a required tool choice's list of calls mid-item): [] when text is not an array."""
    decoder, items = json.JSONDecoder(), []
    pos = len(text) - len(text.lstrip())
    if not text.startswith("[", pos):
        return []
    pos += 1
    while True:
        pos += len(text[pos:]) - len(text[pos:].lstrip())
        try:
            item, pos = decoder.raw_decode(text, pos)
        except (ValueError, RecursionError):
            return items
        items.append(item)
        pos += len(text[pos:]) - len(text[pos:].lstrip())
        if not text.startswith(",", pos):
            return items
        pos += 1


class ForcedToolStream(ToolStream):
    """Named: the header once text arrives, then each piece of the arguments as it comes. Required: the
    calls once the output is complete (a partial JSON array is not a list of calls yet)."""

    def __init__(self, parser: ForcedToolParser):
        super().__init__()
        self._parser = parser
        self._arguments = StrippedText()  # the pieces join to extract's text.strip()
        self._named: ToolCall | None = None

    def _consume(self, final: bool) -> None:
        if self._parser.function is not None:
            piece, self._buf = self._arguments.push(self._buf), ""
            if not piece:
                return
            if self._named is None:
                self._named = ToolCall(self._parser.function, "")
                self._calls.append(self._named)
                self._out.append(call_deltas(0, self._named)[0])  # the header, arguments ""
            self._named.arguments += piece
            self._out.append({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
            return
        if not final:
            return
        extracted, self._buf = self._parser.extract(self._buf), ""
        for call in extracted.tool_calls:
            self._emit_call(call)
        if extracted.content:
            self._emit_text(extracted.content)


def forced_tool_schema(tools: list[dict], function: str | None) -> dict:
    """The JSON schema a forced call's output must match: the named function's parameters, or (required)
    a non-empty array of calls to any of the tools (vLLM's construction)."""
    def parameters(tool: dict) -> dict:
        return tool["function"].get("parameters") or {"type": "object"}

    if function is not None:
        return parameters(next(t for t in tools if t["function"]["name"] == function))
    return {"type": "array", "minItems": 1, "items": {"anyOf": [
        {"type": "object", "additionalProperties": False, "required": ["name", "parameters"],
         "properties": {"name": {"type": "string", "enum": [t["function"]["name"]]}, "parameters": parameters(t)}}
        for t in tools]}}


TOOL_PARSERS: dict[str, type[ToolParser]] = {
    HermesToolParser.name: HermesToolParser,
    Llama3JsonToolParser.name: Llama3JsonToolParser,
}
