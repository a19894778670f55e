"""POST /v1/chat/completions: messages through the chat template, answers split into
reasoning_content (--reasoning-parser), content and tool_calls (--tool-call-parser).

The output text goes through the reasoning parser first, and only the content it leaves goes
through the tool-call parser; streaming uses the parsers' incremental forms, so a streamed answer
joins to the same message a non-streamed one gives.

The prompt: the messages become the dicts chat templates expect, rendered with the tokenizer's
template, and the request's tools and tool_choice become a ToolMode:
- "none": the tools are left out of the prompt and the output is never parsed for calls.
- "auto" (the default when tools are given): the tools go into the prompt through the template's
  `tools` variable; the output is parsed with --tool-call-parser.
- "required": as auto, but a grammar (structured output) forces the output to be a JSON array of
  calls to the tools, each {"name", "parameters"} matching that tool's parameter schema.
- named ({"type": "function", "function": {"name": f}}): only f goes into the prompt, and a grammar
  forces the output to be f's arguments object.
The forced outputs are read by tool_parsers.ForcedToolParser: a finished output always parses to
valid calls; cut short by max_tokens, a named call keeps its partial arguments (streamed as they come,
as in vLLM) and a required list gives its complete calls.
Under --reasoning-parser, a grammar (tool choice, response_format, guided_*) leaves the reasoning free
when the answer starts inside it (deepseek_r1 always; qwen3 when the template left <think> open) and
constrains what follows </think>.
"auto" needs the server started with --tool-call-parser (400 otherwise), as in vLLM; response_format
or guided_* together with a forced tool call is a 400 (one grammar per request).
"""

import asyncio
import dataclasses
import functools
import inspect
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import jinja2
from fastapi import Request
from fastapi.responses import JSONResponse

from graphllm.runtime.outputs import CompletionOutput
from graphllm.runtime.structured_output import StructuredOutputsParams
from graphllm.server.errors import OpenAIError, bad_request
from graphllm.server.protocol import (ChatChoice, ChatChunkChoice, ChatCompletionChunk, ChatCompletionRequest,
                                      ChatCompletionResponse, ChatLogprobs, ChatMessage, NamedToolChoice,
                                      ResponseMessage, ResponseToolCall, TokenizeRequest, TokenLogprob, Tool,
                                      ToolCallFunction, TopLogprob, random_id, usage)
from graphllm.server.serving_engine import OpenAIServing, Reservation, logprob_value, num_visible_tokens
from graphllm.server.streaming import SSE_DONE, EventStreamResponse, sse, sse_error, until_disconnect
from graphllm.server.reasoning_parsers import THINK_CLOSE
from graphllm.server.tool_parsers import ForcedToolParser, forced_tool_schema

logger = logging.getLogger("graphllm.server")


# -- the prompt ------------------------------------------------------------------------------

NEEDS_CONTENT = ("system", "developer", "user", "tool")
REASONING_TAIL_TOKENS = 16  # prompt tokens read back to see whether the template left <think> open


@dataclass(frozen=True)
class ToolMode:
    choice: str  # "none" | "auto" | "required" | "named"
    tools: list[dict] | None = None  # what the chat template gets as `tools`
    name: str | None = None  # the function a named choice asks for

    @property
    def parses(self) -> bool:
        return self.choice != "none"


def tool_mode(req: ChatCompletionRequest, tool_call_parser: str | None) -> ToolMode:
    tools = [tool_dict(t) for t in req.tools or []]
    choice = req.tool_choice
    if isinstance(choice, NamedToolChoice):
        chosen = [t for t in tools if t["function"]["name"] == choice.function.name]
        if not chosen:
            raise bad_request(f"tool_choice names function {choice.function.name!r}, which is not among "
                              "the tools", "tool_choice")
        mode = ToolMode("named", chosen, choice.function.name)
    elif not tools:
        if choice == "required":
            raise bad_request("tool_choice 'required' needs tools", "tool_choice")
        return ToolMode("none")
    elif choice == "none":
        return ToolMode("none")
    else:
        mode = ToolMode(choice or "auto", tools)
    if tool_call_parser is None and mode.choice == "auto":
        raise bad_request("tool_choice 'auto' needs the server started with --tool-call-parser "
                          "(hermes or llama3_json)", "tool_choice")
    return mode


def forced_tool_outputs(mode: ToolMode, parallel: bool = True) -> StructuredOutputsParams | None:
    """The grammar of a required or named tool choice (None for none and auto); parallel False: one call."""
    if mode.choice not in ("required", "named"):
        return None
    schema = forced_tool_schema(mode.tools, mode.name)
    if mode.choice == "required" and not parallel:
        schema = {**schema, "maxItems": 1}
    return StructuredOutputsParams(json=schema)


def tool_dict(tool: Tool) -> dict:
    return tool.model_dump(exclude_none=True)


def message_dicts(messages: list[ChatMessage]) -> list[dict]:
    return [message_dict(i, m) for i, m in enumerate(messages)]


def message_dict(i: int, m: ChatMessage) -> dict:
    """The message as chat templates expect it: text content, tool-call arguments as objects."""
    if m.content is None and m.role in NEEDS_CONTENT:
        raise bad_request(f"messages.{i}.content is required for role {m.role!r}", f"messages.{i}.content")
    if m.role == "tool" and not m.tool_call_id:
        raise bad_request(f"messages.{i}.tool_call_id is required for role 'tool' (the id of the call it answers)",
                          f"messages.{i}.tool_call_id")
    out = {"role": "system" if m.role == "developer" else m.role, "content": content_text(i, m.content)}
    if m.name is not None:
        out["name"] = m.name
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.tool_calls:
        out["tool_calls"] = [{"id": c.id, "type": "function",
                              "function": {"name": c.function.name, "arguments": arguments(c.function.arguments)}}
                             for c in m.tool_calls]
    return out


def message_bytes(m: ChatMessage) -> int:
    """UTF-8 bytes of the text a message hands the chat template: content (its parts' text and the newlines that join
    them), name, reasoning, tool-call id and its calls' names and arguments."""
    separators = 0
    if m.content is None or isinstance(m.content, str):
        texts = [m.content]
    else:
        texts, separators = [part.text for part in m.content], max(len(m.content) - 1, 0)
    texts += [m.name, m.reasoning_content, m.tool_call_id]
    for call in m.tool_calls or ():
        args = call.function.arguments
        texts += [call.id, call.function.name, args if isinstance(args, str) else json.dumps(args)]
    return separators + sum(len(t.encode()) for t in texts if t)


def template_input_bytes(messages: list[ChatMessage], tools: list[dict] | None = None,
                         template_kwargs: dict | None = None) -> int:
    """UTF-8 bytes of everything a request hands the chat template: its messages, its tools' definitions and its
    chat_template_kwargs, as JSON. What the prompt-length check counts before templating (a long tool description
    took ~10 s to tokenize before it was refused)."""
    extra = [x for x in (tools, template_kwargs) if x]
    return sum(message_bytes(m) for m in messages) + sum(len(json.dumps(x).encode()) for x in extra)


def check_template_kwargs(tokenizer, template_kwargs: dict | None, trust_request_chat_template: bool) -> None:
    """chat_template_kwargs carry template variables (enable_thinking, ...). A chat template of the request's own is
    refused unless the server trusts them (vLLM's --trust-request-chat-template: a template is a program, and one
    line of it can render gigabytes); apply_chat_template's own parameters (tokenize, padding, max_length,
    tokenizer_kwargs, ...) are the server's to set."""
    if "chat_template" in (template_kwargs or {}) and not trust_request_chat_template:
        raise bad_request("a chat template was passed with the request, but the server was not started with "
                          "--trust-request-chat-template: refused", "chat_template_kwargs.chat_template")
    owned = template_parameters(type(tokenizer)) - {"chat_template"} if tokenizer is not None else set()
    if refused := sorted(set(template_kwargs or {}) & owned):
        raise bad_request(f"chat_template_kwargs.{refused[0]} is a parameter of apply_chat_template, which the "
                          "server sets; chat_template_kwargs only carries the template's own variables",
                          f"chat_template_kwargs.{refused[0]}")


@functools.cache
def template_parameters(tokenizer_class: type) -> frozenset[str]:
    """Named parameters of tokenizer_class.apply_chat_template (not its **kwargs, which reach the template)."""
    params = inspect.signature(tokenizer_class.apply_chat_template).parameters.values()
    return frozenset(p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)) - {"self"}


def content_text(i: int, content) -> str | None:
    if content is None or isinstance(content, str):
        return content
    texts = []
    for k, part in enumerate(content):
        if part.type != "text":
            raise bad_request(f"messages.{i}.content: only text parts are supported, got {part.type!r}",
                              f"messages.{i}.content")
        if part.text is None:
            raise bad_request(f"messages.{i}.content.{k}.text is required for a part of type 'text'",
                              f"messages.{i}.content.{k}.text")
        texts.append(part.text)
    return "\n".join(texts)


def arguments(value: str | dict) -> str | dict:
    """OpenAI sends arguments as JSON text; Hugging Face templates mostly want the object."""
    if isinstance(value, dict):
        return value
    try:
        parsed = json.loads(value)
    except (ValueError, RecursionError):
        return value
    return parsed if isinstance(parsed, dict) else value


def render_prompt(tokenizer, messages: list[ChatMessage], tools: list[dict] | None = None,
                  template_kwargs: dict | None = None) -> list[int]:
    """Prompt token ids from the tokenizer's chat template; a template failure is the request's fault."""
    kwargs = dict(template_kwargs or {})
    if tools:
        kwargs["tools"] = tools
    dicts = message_dicts(messages)
    try:
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            raise ValueError("this model has no chat template")
        return list(tokenizer.apply_chat_template(dicts, add_generation_prompt=True, tokenize=True,
                                                  return_dict=False, **kwargs))
    except (jinja2.TemplateError, ValueError, TypeError, KeyError) as e:
        raise bad_request(f"the chat template failed on these messages: {e}", "messages") from e
    except RecursionError as e:  # transformers copies the template's input recursively (s37: 500 levels, a 500)
        raise bad_request("what the chat template gets (messages, tool-call arguments, tools, chat_template_kwargs) "
                          "is nested too deeply to render", "messages") from e


# -- the answer ------------------------------------------------------------------------------


@dataclass
class ChoiceState:
    """One streamed choice: its incremental parsers and what it has sent."""

    reasoning: object | None  # a ReasoningStream
    tools: object | None  # a ToolStream
    tokens: int = 0
    done: bool = False
    pending_logprobs: list[TokenLogprob] = field(default_factory=list)


class ServingChat(OpenAIServing):
    async def create(self, req: ChatCompletionRequest, raw: Request):
        self.check_model(req.model)
        self.check_supported(req)
        if req.top_logprobs is not None and not req.logprobs:
            raise bad_request("top_logprobs needs logprobs=true", "top_logprobs")
        self.check_logprobs(req.top_logprobs, "top_logprobs")
        if req.tools and len(req.tools) > self.config.max_tools:
            raise bad_request(f"tools may hold at most {self.config.max_tools} tools, got {len(req.tools)}", "tools")
        mode = tool_mode(req, self.config.tool_call_parser)
        template_kwargs = self.template_kwargs(req)
        self.check_template_input(req.messages, mode.tools, template_kwargs)
        prompt_ids = await asyncio.to_thread(render_prompt, self.engine.tokenizer, req.messages, mode.tools,
                                             template_kwargs)  # templating and tokenizing: off the loop
        asked, param = ((req.max_completion_tokens, "max_completion_tokens") if req.max_completion_tokens
                        is not None else (req.max_tokens, "max_tokens"))
        max_tokens = self.resolve_max_tokens(len(prompt_ids), asked, "messages", param)
        structured = await self.structured_outputs(req, forced_tool_outputs(mode, req.parallel_tool_calls))
        if structured is not None and (parser := self.reasoning_parser()) is not None:
            tail = self.engine.tokenizer.decode(prompt_ids[-REASONING_TAIL_TOKENS:])
            if parser.answer_starts_in_reasoning(tail):  # the reasoning stays free, the answer is constrained
                structured = dataclasses.replace(structured, reasoning_end=THINK_CLOSE)
        params = self.sampling_params(req, max_tokens, (req.top_logprobs or 0) if req.logprobs else None,
                                      structured)
        admitted = self.check_capacity(1)
        request_id = random_id("chatcmpl")
        if req.stream:
            return EventStreamResponse(self.stream(req, mode, prompt_ids, params, request_id, admitted))
        [out] = await until_disconnect(raw, self.collect([prompt_ids], [params], request_id, admitted))
        response = ChatCompletionResponse(
            id=request_id, model=self.config.model_name,
            choices=[self.choice(req, mode, c) for c in out.outputs],
            usage=usage(len(prompt_ids), sum(len(c.token_ids) for c in out.outputs), out.num_cached_tokens))
        return JSONResponse(response.model_dump())

    def template_kwargs(self, req: ChatCompletionRequest | TokenizeRequest) -> dict:
        """What the chat template gets besides messages and tools: the request's chat_template_kwargs and its own
        chat_template, checked (check_template_kwargs). /tokenize takes them too, to count the prompt chat runs."""
        kwargs = dict(req.chat_template_kwargs or {})
        if req.chat_template is not None:
            kwargs["chat_template"] = req.chat_template
        check_template_kwargs(self.engine.tokenizer, kwargs, self.config.trust_request_chat_template)
        return kwargs

    def check_template_input(self, messages: list[ChatMessage], tools: list[dict] | None,
                             template_kwargs: dict) -> None:
        """Refuse messages that cannot fit max_model_len before templating them: the template renders each message
        as one token at least (its role's markers; 500,000 empty messages took 10 s to template and tokenize), and
        everything it gets as check_text_length's tokens at least."""
        if len(messages) >= self.max_model_len:
            raise bad_request(f"This model's maximum context length is {self.max_model_len} tokens. However, your "
                              f"messages hold {len(messages)} messages, at least one token each.", "messages",
                              "context_length_exceeded")
        if self.engine.tokenizer is not None:
            self.check_text_length(template_input_bytes(messages, tools, template_kwargs), "messages")

    # -- parsers -----------------------------------------------------------------------------

    def reasoning_parser(self):
        if self.config.reasoning_parser is None:
            return None
        from graphllm.server.reasoning_parsers import REASONING_PARSERS
        return REASONING_PARSERS[self.config.reasoning_parser]()

    def tool_parser(self, mode: ToolMode):
        if not mode.parses:
            return None
        if mode.choice in ("required", "named"):
            return ForcedToolParser(mode.name)
        from graphllm.server.tool_parsers import TOOL_PARSERS
        return TOOL_PARSERS[self.config.tool_call_parser]()

    def finish_reason(self, mode: ToolMode, c: CompletionOutput, calls: list) -> str:
        """OpenAI's: 'tool_calls' when the model chose to call and stopped; a forced (named) call ends with 'stop';
        an answer cut short by max_tokens is 'length' whatever calls it completed before."""
        called = calls and mode.choice in ("auto", "required") and c.finish_reason != "length"
        return "tool_calls" if called else c.finish_reason

    # -- whole answers -----------------------------------------------------------------------

    def choice(self, req: ChatCompletionRequest, mode: ToolMode, c: CompletionOutput) -> ChatChoice:
        reasoning, content = None, c.text
        if (parser := self.reasoning_parser()) is not None:
            reasoning, content = parser.extract(c.text)
        calls = []
        if (tools := self.tool_parser(mode)) is not None:
            extracted = tools.extract(content or "")
            content, calls = extracted.content, extracted.tool_calls
        finish_reason = self.finish_reason(mode, c, calls)
        message = ResponseMessage(content=content, reasoning_content=reasoning,
                                  tool_calls=[response_tool_call(call) for call in calls])
        logprobs = None
        if req.logprobs:
            logprobs = ChatLogprobs(content=chat_logprobs(c, 0, num_visible_tokens(c), req.top_logprobs or 0))
        return ChatChoice(index=c.index, message=message, logprobs=logprobs, finish_reason=finish_reason,
                          stop_reason=c.stop_reason)

    # -- streaming ---------------------------------------------------------------------------

    async def stream(self, req: ChatCompletionRequest, mode: ToolMode, prompt_ids: list[int], params,
                     request_id: str, admitted: Reservation) -> AsyncIterator[str]:
        created = int(time.time())
        include_usage = req.stream_options is not None and req.stream_options.include_usage
        exclude = None if include_usage else {"usage"}

        def chunk(choices: list[ChatChunkChoice], usage_info=None) -> str:
            return sse(ChatCompletionChunk(id=request_id, created=created, model=self.config.model_name,
                                           choices=choices, usage=usage_info), None if usage_info else exclude)

        states = [self.new_state(mode) for _ in range(req.n)]
        num_output = num_cached = 0
        try:
            for index in range(req.n):
                yield chunk([ChatChunkChoice(index=index, delta={"role": "assistant", "content": ""})])
            async for _, out in self.generate_all([prompt_ids], [params], request_id, admitted):
                num_cached = out.num_cached_tokens
                for c in out.outputs:
                    choices = self.stream_choice(req, mode, c, states[c.index])
                    num_output += len(c.token_ids) if choices and states[c.index].done else 0
                    for choice in choices:
                        yield chunk([choice])
            if include_usage:
                yield chunk([], usage(len(prompt_ids), num_output, num_cached))
        except OpenAIError as e:
            yield sse_error(e)
        except Exception as e:
            logger.exception("chat stream %s failed", request_id)
            yield sse_error(OpenAIError(500, f"internal server error: {type(e).__name__}: {e}"))
        yield SSE_DONE

    def new_state(self, mode: ToolMode) -> ChoiceState:
        reasoning, tools = self.reasoning_parser(), self.tool_parser(mode)
        return ChoiceState(reasoning.stream() if reasoning else None, tools.stream() if tools else None)

    def stream_choice(self, req: ChatCompletionRequest, mode: ToolMode, c: CompletionOutput,
                      state: ChoiceState) -> list[ChatChunkChoice]:
        """Chunk choices for what is new in `c`; logprobs ride on the next chunk that goes out."""
        if state.done:
            return []
        end = num_visible_tokens(c) if c.finished else len(c.token_ids)
        if req.logprobs:
            state.pending_logprobs += chat_logprobs(c, state.tokens, end, req.top_logprobs or 0)
        state.tokens, state.done = end, c.finished
        deltas = parse_delta(state, c.delta_text, c.finished)
        finish_reason = None
        if c.finished:
            finish_reason = self.finish_reason(mode, c, state.tools.tool_calls if state.tools else [])
            deltas = deltas or [{}]
        choices = []
        for k, delta in enumerate(deltas):
            last = k == len(deltas) - 1
            logprobs = None
            if state.pending_logprobs and k == 0:
                logprobs, state.pending_logprobs = ChatLogprobs(content=state.pending_logprobs), []
            choices.append(ChatChunkChoice(index=c.index, delta=delta, logprobs=logprobs,
                                           finish_reason=finish_reason if last else None,
                                           stop_reason=c.stop_reason if last and c.finished else None))
        return choices


def parse_delta(state: ChoiceState, text: str, final: bool) -> list[dict]:
    """New model text -> chunk deltas (reasoning_content, content, tool_calls), through the parsers."""
    deltas, content = [], text
    if state.reasoning is not None:
        reasoning, content = state.reasoning.feed(text)
        if final:
            more_reasoning, more_content = state.reasoning.finish()
            reasoning, content = reasoning + more_reasoning, content + more_content
        if reasoning:
            deltas.append({"reasoning_content": reasoning})
    if state.tools is None:
        return deltas + ([{"content": content}] if content else [])
    deltas += state.tools.feed(content) if content else []
    return deltas + (state.tools.finish() if final else [])


def response_tool_call(call) -> ResponseToolCall:
    return ResponseToolCall(id=call.id, function=ToolCallFunction(name=call.name, arguments=call.arguments))


def chat_logprobs(c: CompletionOutput, start: int, end: int, num_top: int) -> list[TokenLogprob]:
    """Chat logprobs of output tokens [start, end): the sampled token and the num_top most likely."""
    out = []
    for token_id, entry in zip(c.token_ids[start:end], c.logprobs[start:end]):
        ranked = sorted(entry.items(), key=lambda kv: kv[1].rank)[:num_top]
        out.append(TokenLogprob(**top_logprob(token_id, entry[token_id]),
                                top_logprobs=[TopLogprob(**top_logprob(t, lp)) for t, lp in ranked]))
    return out


def top_logprob(token_id: int, lp) -> dict:
    text = lp.decoded_token if lp.decoded_token is not None else f"token_id:{token_id}"
    return {"token": text, "logprob": logprob_value(lp.logprob), "bytes": list(text.encode("utf-8"))}
