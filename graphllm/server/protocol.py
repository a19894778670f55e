"""Request and response bodies of the OpenAI API (the subset we serve), plus vLLM's extra fields.

Unknown request fields are accepted and ignored, as vLLM and most OpenAI-compatible servers do:
clients send fields such as `user`, `store` or `service_tier` that change nothing here. Fields we
understand but cannot honour yet (best_of other than n, ...) are refused with a 400 by the serving layer
instead of being silently dropped.
"""

import json
import re
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

LONE_SURROGATE_ERROR = "lone_surrogate"
SCALARS = frozenset({int, float, bool, type(None)})
LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # JSON's "\\ud800" escapes decode to these; UTF-8 cannot hold them


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


class OpenAIBaseModel(BaseModel):
    # NaN and +-inf (JSON's NaN, Infinity, or 1e999) are refused in every float field
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)


# -- requests ---------------------------------------------------------------------------------

def utf8_encodable(body: Any) -> bool:
    """Whether every string of a parsed JSON body (keys included) can be encoded as UTF-8, checked at C speed: walking
    the body in Python cost 3.5 s of the event loop for 16 MB of empty objects (s37's fuzzing)."""
    try:
        json.dumps(body, ensure_ascii=False).encode()
    except (ValueError, TypeError, RecursionError):  # a lone surrogate; not JSON data; nested past C's depth
        return False
    return True


def lone_surrogate_path(body: Any) -> str | None:
    """The path ('messages.0.content') of the first string in a parsed JSON body (keys included) that holds a lone
    UTF-16 surrogate, or None. Iterative (a deeply nested body does not reach the recursion limit); numbers are
    not pushed, and a list of numbers only (a token-id prompt) is skipped whole."""
    if utf8_encodable(body):
        return None
    stack: list[tuple[str, Any]] = [("", body)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            if LONE_SURROGATE.search(value):
                return path or "body"
            continue
        if isinstance(value, list) and set(map(type, value)) <= SCALARS:  # a token-id prompt: one pass in C
            continue
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        for key, item in items:
            if isinstance(key, str) and LONE_SURROGATE.search(key):
                return path or "body"
            if isinstance(item, (str, dict, list)):
                stack.append((f"{path}.{key}" if path else str(key), item))
    return None


class RequestBody(OpenAIBaseModel):
    """A route's whole body: text that UTF-8 cannot encode (a lone surrogate) is a 400, not a 500 where it is
    tokenized, encoded or echoed in an error."""

    @model_validator(mode="before")
    @classmethod
    def refuse_lone_surrogates(cls, data: Any) -> Any:
        if (path := lone_surrogate_path(data)) is not None:  # errors.validation_error makes it a 400 naming path
            raise PydanticCustomError(LONE_SURROGATE_ERROR, "{path}: text holds a lone UTF-16 surrogate (an unpaired "
                                      "\\ud800-\\udfff escape), which is not valid Unicode", {"path": path})
        return data


class StreamOptions(OpenAIBaseModel):
    include_usage: bool = False


class JsonSchemaFormat(OpenAIBaseModel):
    name: str | None = None
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(OpenAIBaseModel):
    type: Literal["text", "json_object", "json_schema"] = "text"
    json_schema: JsonSchemaFormat | None = None


class SamplingRequest(RequestBody):
    """Fields completions and chat completions share."""

    model: str | None = None  # None: the served model
    n: int = 1
    best_of: int | None = None
    temperature: float | None = None  # None: generation_config.json's, else 1.0
    top_p: float | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    response_format: ResponseFormat | None = None
    user: str | None = None  # OpenAI's end-user id: accepted and unused, as vLLM does (not an unknown field)
    # vLLM's extra sampling fields
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    # vLLM's structured-output fields (the guided_* ones are its older names)
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    structured_outputs: dict[str, Any] | None = None


class CompletionRequest(SamplingRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16
    echo: bool = False
    logprobs: int | None = None
    suffix: str | None = None


class TextPart(OpenAIBaseModel):
    type: str
    text: str | None = None


class FunctionCall(OpenAIBaseModel):
    name: str
    arguments: str | dict[str, Any] = "{}"


class MessageToolCall(OpenAIBaseModel):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(OpenAIBaseModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class FunctionDefinition(OpenAIBaseModel):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(OpenAIBaseModel):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(OpenAIBaseModel):
    name: str


class NamedToolChoice(OpenAIBaseModel):
    type: Literal["function"] = "function"
    function: NamedFunction


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True  # false: tool_choice "required" forces exactly one call
    chat_template: str | None = None  # vLLM's: the request's own template (--trust-request-chat-template)
    chat_template_kwargs: dict[str, Any] | None = None


class TokenizeRequest(RequestBody):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    tools: list[Tool] | None = None
    chat_template: str | None = None  # with messages, as in a chat request
    chat_template_kwargs: dict[str, Any] | None = None


class DetokenizeRequest(RequestBody):
    model: str | None = None
    tokens: list[int]


# -- responses --------------------------------------------------------------------------------

class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None) -> UsageInfo:
    """OpenAI's usage; prompt_tokens_details.cached_tokens where the engine caches prefixes."""
    details = None if cached_tokens is None else PromptTokensDetails(cached_tokens=cached_tokens)
    return UsageInfo(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                     total_tokens=prompt_tokens + completion_tokens, prompt_tokens_details=details)


class CompletionLogprobs(BaseModel):
    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    top_logprobs: list[dict[str, float] | None] = []
    text_offset: list[int] = []


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = []


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob] | None = None


class ToolCallFunction(BaseModel):
    name: str
    arguments: str


class ResponseToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ResponseToolCall] = []


class ChatChoice(BaseModel):
    index: int
    message: ResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo


class ChatChunkChoice(BaseModel):
    index: int
    delta: dict[str, Any]  # {"role"} | {"content"} | {"reasoning_content"} | {"tool_calls": [...]}
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: UsageInfo | None = None
