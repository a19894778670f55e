"""tools / tool_choice and reasoning_content over HTTP.

The scripted server (tests/server/scripted.py) answers in known text, so these check the server's
side: what the template gets, how parsed calls come out whole and streamed, and what required /
named tool choices ask the engine for (a grammar). The last tests run the real demo model.
"""

import json

import openai
import pytest

from graphllm.server.serving_chat import tool_mode
from graphllm.server.protocol import ChatCompletionRequest
from tests.server.conftest import MODEL
from tests.server.scripted import PIECE

MULTIPLY = {"type": "function", "function": {
    "name": "multiply", "description": "Multiply two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}
ADD = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
QUESTION = [{"role": "user", "content": "What is 7 times 8?"}]


@pytest.fixture
def scripted(scripted_server) -> openai.OpenAI:
    return scripted_server.client()


def streamed_calls(chunks) -> tuple[dict[int, dict], str, list[str]]:
    """Assemble streamed tool_calls deltas: index -> {id, name, arguments}; content; finish reasons."""
    calls, content, finish = {}, "", []
    for chunk in chunks:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            finish += [choice.finish_reason] if choice.finish_reason else []
            for d in choice.delta.tool_calls or []:
                call = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
                call["id"] = d.id or call["id"]
                call["name"] += (d.function.name or "") if d.function else ""
                call["arguments"] += (d.function.arguments or "") if d.function else ""
    return calls, content, finish


def test_auto_tool_call_whole_and_streamed_then_the_answer(scripted, scripted_server):
    out = scripted.chat.completions.create(model=MODEL, messages=QUESTION, tools=[MULTIPLY])
    [choice] = out.choices
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_") and call.function.name == "multiply"
    assert json.loads(call.function.arguments) == {"a": 7, "b": 8}
    assert scripted_server.engine.last_tools == [MULTIPLY]  # auto: the template saw the tools

    calls, content, finish = streamed_calls(scripted.chat.completions.create(
        model=MODEL, messages=QUESTION, tools=[MULTIPLY], stream=True))
    assert list(calls) == [0] and calls[0]["name"] == "multiply" and calls[0]["id"].startswith("call_")
    assert json.loads(calls[0]["arguments"]) == {"a": 7, "b": 8}
    assert content == "" and finish == ["tool_calls"]

    follow_up = QUESTION + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                            {"role": "tool", "tool_call_id": call.id, "content": "56"}]
    answer = scripted.chat.completions.create(model=MODEL, messages=follow_up, tools=[MULTIPLY])
    assert answer.choices[0].message.content == "The product is 56."
    assert answer.choices[0].message.tool_calls == [] and answer.choices[0].finish_reason == "stop"


def test_tool_choice_none_leaves_tools_out_and_text_unparsed(scripted, scripted_server):
    out = scripted.chat.completions.create(model=MODEL, messages=QUESTION, tools=[MULTIPLY], tool_choice="none")
    assert scripted_server.engine.last_tools is None
    assert out.choices[0].message.tool_calls == [] and "<tool_call>" in out.choices[0].message.content


def test_named_tool_choice_is_forced_by_the_functions_schema(scripted, scripted_server):
    named = {"type": "function", "function": {"name": "multiply"}}
    out = scripted.chat.completions.create(model=MODEL, messages=QUESTION, tools=[ADD, MULTIPLY], tool_choice=named)
    assert scripted_server.engine.last_tools == [MULTIPLY]  # only the named tool reaches the prompt
    assert scripted_server.engine.last_params.structured_outputs.json == MULTIPLY["function"]["parameters"]
    [call] = out.choices[0].message.tool_calls
    assert call.function.name == "multiply" and json.loads(call.function.arguments) == {"a": 7, "b": 8}
    assert out.choices[0].finish_reason == "stop" and out.choices[0].message.content is None  # OpenAI's, forced
    calls, content, finish = streamed_calls(scripted.chat.completions.create(
        model=MODEL, messages=QUESTION, tools=[ADD, MULTIPLY], tool_choice=named, stream=True))
    assert [c["name"] for c in calls.values()] == ["multiply"] and json.loads(calls[0]["arguments"]) == {"a": 7, "b": 8}
    assert content == "" and finish == ["stop"]


def test_required_is_forced_as_an_array_of_calls_whole_and_streamed(scripted, scripted_server):
    chat = [{"role": "user", "content": "Hello there."}]  # a question the script would not call a tool for
    out = scripted.chat.completions.create(model=MODEL, messages=chat, tools=[ADD, MULTIPLY], tool_choice="required")
    schema = scripted_server.engine.last_params.structured_outputs.json
    assert schema["type"] == "array" and schema["minItems"] == 1
    assert [item["properties"]["name"]["enum"] for item in schema["items"]["anyOf"]] == [["add"], ["multiply"]]
    assert out.choices[0].finish_reason == "tool_calls"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in out.choices[0].message.tool_calls] == [
        ("multiply", {"a": 0, "b": 0})]
    calls, content, finish = streamed_calls(scripted.chat.completions.create(
        model=MODEL, messages=QUESTION, tools=[MULTIPLY], tool_choice="required", stream=True))
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [("multiply", {"a": 7, "b": 8})]
    assert finish == ["tool_calls"]


def test_a_required_list_cut_by_max_tokens_finishes_with_length_not_tool_calls(scripted):
    """Regression (s35's fuzzing): a required list cut short by max_tokens after a complete call said
    'tool_calls', as if the model had stopped; OpenAI (and vLLM) say 'length'. Its complete calls still count."""
    for a in range(2, 40):  # numbers whose call ends a piece before the list's closing bracket
        question = [{"role": "user", "content": f"What is {a} times 8?"}]
        text = json.dumps([{"name": "multiply", "parameters": {"a": a, "b": 8}}])
        if -(-(text.rindex("}") + 1) // PIECE) < -(-len(text) // PIECE):
            break
    max_tokens = -(-(text.rindex("}") + 1) // PIECE)
    out = scripted.chat.completions.create(model=MODEL, messages=question, tools=[MULTIPLY], tool_choice="required",
                                           max_tokens=max_tokens)
    assert out.choices[0].finish_reason == "length" and out.usage.completion_tokens == max_tokens
    assert [(c.function.name, json.loads(c.function.arguments)) for c in out.choices[0].message.tool_calls] == [
        ("multiply", {"a": a, "b": 8})]
    calls, _, finish = streamed_calls(scripted.chat.completions.create(
        model=MODEL, messages=question, tools=[MULTIPLY], tool_choice="required", max_tokens=max_tokens, stream=True))
    assert len(calls) == 1 and finish == ["length"]


def test_a_forced_call_and_another_grammar_is_a_400(scripted):
    with pytest.raises(openai.BadRequestError) as e:
        scripted.chat.completions.create(model=MODEL, messages=QUESTION, tools=[MULTIPLY], tool_choice="required",
                                         response_format={"type": "json_object"})
    assert "one structured output per request" in e.value.message


def test_n_choices_each_parse_their_calls(scripted):
    out = scripted.chat.completions.create(model=MODEL, messages=QUESTION, tools=[MULTIPLY], n=2)
    assert [len(c.message.tool_calls) for c in out.choices] == [1, 1]
    assert out.choices[0].message.tool_calls[0].id != out.choices[1].message.tool_calls[0].id
    calls, _, finish = streamed_calls(scripted.chat.completions.create(
        model=MODEL, messages=QUESTION, tools=[MULTIPLY], n=2, stream=True))
    assert finish == ["tool_calls", "tool_calls"]


def test_reasoning_content_whole_and_streamed(scripted):
    messages = [{"role": "user", "content": "think: what is 7 times 8?"}]
    message = scripted.chat.completions.create(model=MODEL, messages=messages).choices[0].message
    assert message.reasoning_content == "Seven times eight is fifty-six." and message.content == "It is 56."
    reasoning, content = "", ""
    for chunk in scripted.chat.completions.create(model=MODEL, messages=messages, stream=True):
        delta = chunk.choices[0].delta
        reasoning += getattr(delta, "reasoning_content", None) or ""
        content += delta.content or ""
    assert (reasoning, content) == (message.reasoning_content, message.content)


def test_auto_tool_choice_needs_a_tool_call_parser_and_forced_ones_do_not():
    request = ChatCompletionRequest(messages=QUESTION, tools=[MULTIPLY])
    assert tool_mode(request, "hermes").choice == "auto"
    with pytest.raises(Exception, match="--tool-call-parser"):
        tool_mode(request, None)
    assert tool_mode(ChatCompletionRequest(messages=QUESTION, tools=[MULTIPLY], tool_choice="required"), None).choice \
        == "required"
    assert tool_mode(ChatCompletionRequest(messages=QUESTION, tools=[MULTIPLY], tool_choice="none"), None).choice \
        == "none"


def test_demo_model_calls_multiply(server, client):
    """End to end with the real demo model, trained to call the multiply tool (scripts/train_demo.py)."""
    if server.engine.state.model_path.name != "demo_model":
        pytest.skip("runs on the demo model only")
    out = client.chat.completions.create(model=MODEL, messages=QUESTION, tools=[MULTIPLY], temperature=0,
                                         max_tokens=48)
    assert out.choices[0].message.tool_calls, f"no tool call; the model said {out.choices[0].message.content!r}"
    [call] = out.choices[0].message.tool_calls
    assert call.function.name == "multiply" and json.loads(call.function.arguments) == {"a": 7, "b": 8}
    calls, _, finish = streamed_calls(client.chat.completions.create(
        model=MODEL, messages=QUESTION, tools=[MULTIPLY], temperature=0, max_tokens=48, stream=True))
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [("multiply", {"a": 7, "b": 8})]
    assert finish == ["tool_calls"]
    follow_up = QUESTION + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                            {"role": "tool", "tool_call_id": call.id, "content": "56"}]
    answer = client.chat.completions.create(model=MODEL, messages=follow_up, tools=[MULTIPLY], temperature=0,
                                            max_tokens=48)
    assert "56" in answer.choices[0].message.content and not answer.choices[0].message.tool_calls


@pytest.mark.parametrize("tool_choice, parallel", [("required", True), ("required", False),
                                                    ({"type": "function", "function": {"name": "multiply"}}, True)])
def test_demo_model_forced_calls_always_parse(server, client, tool_choice, parallel):
    """Sampled freely (temperature 1, several seeds), forced calls always parse to valid calls to multiply;
    a required list of parallel calls may run to max_tokens, and its complete calls are still returned."""
    for seed in range(3):
        out = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi!"}],
                                             tools=[MULTIPLY], tool_choice=tool_choice, temperature=1.0, seed=seed,
                                             max_tokens=400, parallel_tool_calls=parallel)
        choice = out.choices[0]
        if parallel and tool_choice == "required":  # the list may run to max_tokens: its complete calls count
            assert choice.finish_reason in ("tool_calls", "length"), choice.finish_reason
        else:
            assert choice.finish_reason in ("stop", "tool_calls"), (choice.finish_reason, choice.message.content)
        calls = choice.message.tool_calls
        assert calls and (parallel or len(calls) == 1), choice.message
        for call in calls:
            arguments = json.loads(call.function.arguments)
            assert call.function.name == "multiply" and set(arguments) >= {"a", "b"}
            assert isinstance(arguments["a"], int) and isinstance(arguments["b"], int)
