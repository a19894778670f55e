"""Reasoning parsers: split ``<think>...</think>`` reasoning out of the model output.

Chosen with ``--reasoning-parser``; the split text becomes ``reasoning_content`` beside
``content`` in chat completions.

- ``deepseek_r1``: the chat template already opened ``<think>``, so the output starts inside the
  reasoning (an explicit leading ``<think>`` is dropped too); everything up to ``</think>`` is
  reasoning, the rest content. Without ``</think>`` the whole output is reasoning.
- ``qwen3``: reasoning only inside an explicit ``<think>...</think>`` (the first one); without
  tags the output is all content, unchanged. An unclosed ``<think>`` runs to the end.

Reasoning is stripped at both ends and content after ``</think>`` at its start (models put blank
lines there). ``stream`` agrees with ``extract``: the streamed deltas of each kind join to what
``extract`` gives (``""`` for None), and never contain part of a tag.
"""

from __future__ import annotations

from typing import ClassVar

from graphllm.server.tool_parsers import StrippedText, split_partial_tag

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def _none_if_empty(text: str) -> str | None:
    return text or None


class ReasoningStream:
    """Incremental splitter for one generation: ``feed`` text, get ``(reasoning, content)``.

    Subclasses implement ``_consume(final)``, which eats what it can of ``self._buf`` and reports
    it through ``_emit_reasoning`` and ``_emit_content``.
    """

    def __init__(self) -> None:
        self._buf = ""
        self._reasoning_text = StrippedText()
        self._strip_content = False  # the next content starts after </think>: drop its spaces
        self._reasoning, self._content = [], []

    def feed(self, delta: str) -> tuple[str, str]:
        """New model text -> ``(reasoning delta, content delta)`` to send now (either may be "")."""
        self._buf += delta
        self._consume(final=False)
        return self._drain()

    def finish(self) -> tuple[str, str]:
        """End of generation: flush text held back as a possible tag."""
        self._consume(final=True)
        return self._drain()

    def _consume(self, final: bool) -> None:
        raise NotImplementedError

    def _emit_reasoning(self, text: str) -> None:
        self._reasoning.append(self._reasoning_text.push(text))

    def _emit_content(self, text: str) -> None:
        if self._strip_content:
            text = text.lstrip()
            self._strip_content = not text
        self._content.append(text)

    def _drain(self) -> tuple[str, str]:
        out = "".join(self._reasoning), "".join(self._content)
        self._reasoning, self._content = [], []
        return out

    def _consume_until(self, tag: str, emit, final: bool) -> bool:
        """Send buffered text up to ``tag`` through ``emit`` and drop the tag (True); without
        the tag, send all but a possible partial tag (False)."""
        head, found, tail = self._buf.partition(tag)
        if found:
            emit(head)
            self._buf = tail
            return True
        ready, held = (self._buf, "") if final else split_partial_tag(self._buf, tag)
        emit(ready)
        self._buf = held
        return False


class ReasoningParser:
    """A reasoning format: whole-output ``extract`` and incremental ``stream``."""

    name: ClassVar[str]

    def extract(self, text: str) -> tuple[str | None, str | None]:
        """``(reasoning_content, content)`` of a whole output; None where empty."""
        raise NotImplementedError

    def stream(self) -> ReasoningStream:
        """A fresh incremental splitter for one generation."""
        raise NotImplementedError

    def answer_starts_in_reasoning(self, prompt_tail: str) -> bool:
        """Whether the output begins inside reasoning, given the prompt's last characters: then a grammar
        (structured output) waits for ``</think>``, leaving the reasoning free."""
        return prompt_tail.rfind(THINK_OPEN) > prompt_tail.rfind(THINK_CLOSE)


# ------------------------------------------------------------------------------------ deepseek_r1

class DeepSeekR1ReasoningParser(ReasoningParser):
    """Output starts inside the reasoning; ``</think>`` ends it."""

    name = "deepseek_r1"

    def extract(self, text: str) -> tuple[str | None, str | None]:
        text = text.lstrip()
        text = text.removeprefix(THINK_OPEN)
        reasoning, _, content = text.partition(THINK_CLOSE)
        return _none_if_empty(reasoning.strip()), _none_if_empty(content.lstrip())

    def stream(self) -> DeepSeekR1ReasoningStream:
        return DeepSeekR1ReasoningStream()

    def answer_starts_in_reasoning(self, prompt_tail: str) -> bool:
        return True  # the template opened <think>, or the model writes it first: reasoning either way


class DeepSeekR1ReasoningStream(ReasoningStream):
    """Modes: ``start`` (drop a leading ``<think>``), ``reasoning``, ``content``."""

    def __init__(self) -> None:
        super().__init__()
        self._mode = "start"

    def _consume(self, final: bool) -> None:
        if self._mode == "start":
            head = self._buf.lstrip()
            if THINK_OPEN.startswith(head) and head != THINK_OPEN and not final:
                return  # still could be the opening tag (or only spaces so far)
            self._buf = head.removeprefix(THINK_OPEN)
            self._mode = "reasoning"
        if self._mode == "reasoning":
            if not self._consume_until(THINK_CLOSE, self._emit_reasoning, final):
                return
            self._mode, self._strip_content = "content", True
        self._emit_content(self._buf)
        self._buf = ""


# ------------------------------------------------------------------------------------------ qwen3

class Qwen3ReasoningParser(ReasoningParser):
    """Reasoning only inside the first explicit ``<think>...</think>``."""

    name = "qwen3"

    def extract(self, text: str) -> tuple[str | None, str | None]:
        before, found, rest = text.partition(THINK_OPEN)
        if not found:
            return None, _none_if_empty(text)
        reasoning, closed, after = rest.partition(THINK_CLOSE)
        content = before + (after.lstrip() if closed else "")
        return _none_if_empty(reasoning.strip()), _none_if_empty(content)

    def stream(self) -> Qwen3ReasoningStream:
        return Qwen3ReasoningStream()


class Qwen3ReasoningStream(ReasoningStream):
    """Modes: ``content`` (before ``<think>``), ``reasoning``, ``after`` (content after
    ``</think>``, no more tags)."""

    def __init__(self) -> None:
        super().__init__()
        self._mode = "content"

    def _consume(self, final: bool) -> None:
        if self._mode == "content":
            if not self._consume_until(THINK_OPEN, self._emit_content, final):
                return
            self._mode = "reasoning"
        if self._mode == "reasoning":
            if not self._consume_until(THINK_CLOSE, self._emit_reasoning, final):
                return
            self._mode, self._strip_content = "after", True
        self._emit_content(self._buf)
        self._buf = ""


REASONING_PARSERS: dict[str, type[ReasoningParser]] = {
    DeepSeekR1ReasoningParser.name: DeepSeekR1ReasoningParser,
    Qwen3ReasoningParser.name: Qwen3ReasoningParser,
}
