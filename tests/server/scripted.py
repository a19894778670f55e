"""An engine whose answers follow a script, for the server's tool-call and reasoning paths.

An EngineClient that lends a real Engine's limits, model path and stats to the server, and its
tokenizer behind a RecordingTokenizer (which remembers what the chat template was given), but
`stream` answers from `reply(messages, tools)` in three-character pieces (a token each, up to
max_tokens), so the incremental parsers see tags split across chunks.
"""

import asyncio
import json
import re

from graphllm.runtime.outputs import CompletionOutput, RequestOutput

PIECE = 3  # characters per step


def reply(messages: list[dict], tools: list[dict] | None, forced=None) -> str:
    """multiply questions -> a hermes call; tool results -> a sentence; 'think:' -> reasoning. Under a forced
    tool call's grammar (structured output: an array schema for required, else the named function's
    parameters) what that grammar would let through: the multiply call's arguments as the JSON it asks for."""
    last = messages[-1]
    if forced is not None:
        a, b = (list(map(int, re.findall(r"\d+", last["content"])[:2])) + [0, 0])[:2]
        arguments = {"a": a, "b": b}
        return json.dumps([{"name": "multiply", "parameters": arguments}] if forced.json.get("type") == "array"
                          else arguments)
    if last["role"] == "tool":
        return f"The product is {last['content']}."
    text = last["content"]
    if text.startswith("think:"):
        return "<think>Seven times eight is fifty-six.</think>\n\nIt is 56."
    if text.startswith("call other:"):
        return '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
    if (numbers := re.findall(r"\d+", text)) and "times" in text:
        a, b = map(int, numbers[:2])
        return f'<tool_call>{{"name": "multiply", "arguments": {{"a": {a}, "b": {b}}}}}</tool_call>'
    return "I can only multiply."


class RecordingTokenizer:
    """The real tokenizer, but apply_chat_template records the messages and tools of each prompt."""

    def __init__(self, tokenizer, scripted: "ScriptedEngine"):
        self.tokenizer, self.scripted = tokenizer, scripted

    def __getattr__(self, name: str):
        return getattr(self.tokenizer, name)

    def apply_chat_template(self, messages: list[dict], **kwargs):
        ids = list(self.tokenizer.apply_chat_template(messages, **kwargs))
        self.scripted.rendered[tuple(ids)] = (json.loads(json.dumps(messages)), kwargs.get("tools"))
        self.scripted.last_tools = kwargs.get("tools")
        return ids


class ScriptedEngine:
    def __init__(self, engine):
        self.engine = engine
        self.tokenizer = RecordingTokenizer(engine.tokenizer, self)
        self.limits, self.model_path = engine.limits, engine.model_path
        self.rendered: dict[tuple[int, ...], tuple[list[dict], list[dict] | None]] = {}
        self.last_tools: list[dict] | None = None
        self.last_params = None

    def stats(self):
        return self.engine.stats()

    def check_health(self) -> None:
        self.engine.check_health()

    def reset_prefix_cache(self) -> int:
        return self.engine.reset_prefix_cache()

    def check_structured_outputs(self, params) -> None:
        self.engine.check_structured_outputs(params)

    def abort(self, request_id: str) -> None:
        self.engine.abort(request_id)

    async def stream(self, prompt: list[int], params, request_id: str | None = None):
        self.last_params = params
        text = reply(*self.rendered[tuple(prompt)], params.structured_outputs)
        pieces = [text[i:i + PIECE] for i in range(0, len(text), PIECE)]
        eos = min(self.engine.state.eos_token_ids)
        for step in range(1, len(pieces) + 2):  # the last step samples EOS; a piece a token
            cut = step == params.max_tokens and step <= len(pieces)  # max_tokens ran out before EOS
            finished = cut or step > len(pieces)
            token_ids = list(range(10, 10 + min(step, len(pieces)))) + ([eos] if finished and not cut else [])
            delta = "" if step > len(pieces) else pieces[step - 1]
            reason = "length" if cut else "stop" if finished else None
            outputs = [CompletionOutput(i, "".join(pieces[:step]), token_ids, None, reason, None, delta)
                       for i in range(params.n)]
            yield RequestOutput(request_id, None, list(prompt), outputs, finished)
            if finished:
                return
            await asyncio.sleep(0)
