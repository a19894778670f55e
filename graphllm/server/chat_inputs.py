"""From a chat request to prompt token ids: messages for the chat template, and the tool mode.

Tool choice without structured output (we cannot force the model's tokens yet):
- "none": the tools are left out of the prompt and the output is never parsed for calls.
- "auto" (the default when tools are given): the tools go into the prompt through the template's
  `tools` variable; the output is parsed with --tool-call-parser.
- "required": as auto, but an output without a valid call is an error (400).
- named ({"type": "function", "function": {"name": f}}): only f goes into the prompt; an output
  without a call, or with a call to anything but f, is an error (400).
Tools other than "none" need the server started with --tool-call-parser (400 otherwise), as in vLLM.
"""

import json
from dataclasses import dataclass

import jinja2

from graphllm.server.errors import bad_request
from graphllm.server.protocol import ChatCompletionRequest, ChatMessage, NamedToolChoice, Tool

NEEDS_CONTENT = ("system", "developer", "user", "tool")


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
    if tool_call_parser is None:
        raise bad_request(f"tool_choice {mode.choice!r} needs the server started with --tool-call-parser "
                          "(hermes or llama3_json)", "tool_choice")
    return mode


def tool_dict(tool: Tool) -> dict:
    return tool.model_dump(exclude_none=True)


def message_dicts(messages: list[ChatMessage]) -> list[dict]:
    return [message_dict(i, m) for i, m in enumerate(messages)]


def message_dict(i: int, m: ChatMessage) -> dict:
    """The message as chat templates expect it: text content, tool-call arguments as objects."""
    if m.content is None and m.role in NEEDS_CONTENT:
        raise bad_request(f"messages.{i}.content is required for role {m.role!r}", f"messages.{i}.content")
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


def content_text(i: int, content) -> str | None:
    if content is None or isinstance(content, str):
        return content
    texts = []
    for part in content:
        if part.type != "text" or part.text is None:
            raise bad_request(f"messages.{i}.content: only text parts are supported, got {part.type!r}",
                              f"messages.{i}.content")
        texts.append(part.text)
    return "\n".join(texts)


def arguments(value: str | dict) -> str | dict:
    """OpenAI sends arguments as JSON text; Hugging Face templates mostly want the object."""
    if isinstance(value, dict):
        return value
    try:
        parsed = json.loads(value)
    except ValueError:
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
