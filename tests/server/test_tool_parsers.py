"""Tests for graphllm.server.tool_parsers: whole-text extraction, and streaming the same texts
in arbitrary chunks (every split point, seeded random chunkings, one character at a time)."""

import json
import random

import pytest

from graphllm.server.tool_parsers import (
    TOOL_PARSERS, ExtractedToolCalls, HermesToolParser, Llama3JsonToolParser, ToolCall,
    split_partial_tag,
)

MUL = '{"name": "multiply", "arguments": {"a": 6, "b": 7}}'
WEATHER = '{"name": "get_weather", "arguments": {"city": "Zürich", "units": {"t": "C"}}}'

# (text, expected content, expected [(name, arguments object)])
HERMES_CASES = {
    "one_call": (f"<tool_call>\n{MUL}\n</tool_call>", None, [("multiply", {"a": 6, "b": 7})]),
    "several_calls": (
        f"<tool_call>{MUL}</tool_call>\n<tool_call>\n{WEATHER}\n</tool_call>", None,
        [("multiply", {"a": 6, "b": 7}), ("get_weather", {"city": "Zürich", "units": {"t": "C"}})],
    ),
    "content_before": (
        f"Let me compute that.\n\n<tool_call>\n{MUL}\n</tool_call>", "Let me compute that.",
        [("multiply", {"a": 6, "b": 7})],
    ),
    "content_between_and_after": (
        f"A <tool_call>{MUL}</tool_call>  B <tool_call>{WEATHER}</tool_call> C  ", "A   B  C",
        [("multiply", {"a": 6, "b": 7}), ("get_weather", {"city": "Zürich", "units": {"t": "C"}})],
    ),
    "malformed_json": (
        '<tool_call>{"name": "multiply", "arguments": {"a": 6,}}</tool_call>',
        '<tool_call>{"name": "multiply", "arguments": {"a": 6,}}</tool_call>', [],
    ),
    "malformed_then_valid": (
        f"<tool_call>not json</tool_call><tool_call>{MUL}</tool_call>",
        "<tool_call>not json</tool_call>", [("multiply", {"a": 6, "b": 7})],
    ),
    "missing_name": ('x <tool_call>{"arguments": {}}</tool_call>',
                     'x <tool_call>{"arguments": {}}</tool_call>', []),
    "no_call": ("The answer is 42 < 43, see <tool> and <tool_c.", "The answer is 42 < 43, see <tool> and <tool_c.", []),
    "unterminated_valid": (f"ok <tool_call>\n{MUL}\n", "ok", [("multiply", {"a": 6, "b": 7})]),
    "unterminated_truncated": ('ok <tool_call>{"name": "multiply", "argu',
                               'ok <tool_call>{"name": "multiply", "argu', []),
    "quoted_arguments": ('<tool_call>{"name": "f", "arguments": "{\\"x\\": [1, 2]}"}</tool_call>', None,
                         [("f", {"x": [1, 2]})]),
    "empty": ("", None, []),
}

LLAMA_CASES = {
    "one_call": ('{"name": "multiply", "parameters": {"a": 6, "b": 7}}', None, [("multiply", {"a": 6, "b": 7})]),
    "python_tag": ('<|python_tag|>{"name": "multiply", "parameters": {"a": 6, "b": 7}}', None,
                   [("multiply", {"a": 6, "b": 7})]),
    "several_calls": (
        '<|python_tag|>{"name": "multiply", "parameters": {"a": 6, "b": 7}}; '
        '{"name": "get_weather", "arguments": {"city": "Zürich"}};', None,
        [("multiply", {"a": 6, "b": 7}), ("get_weather", {"city": "Zürich"})],
    ),
    "newline_separated": ('\n{"name": "f", "parameters": {}}\n{"name": "g", "parameters": {"s": "}{;"}}\n', None,
                          [("f", {}), ("g", {"s": "}{;"})]),
    "content_before": ('Calling it now.<|python_tag|>{"name": "multiply", "parameters": {"a": 6, "b": 7}}',
                       "Calling it now.", [("multiply", {"a": 6, "b": 7})]),
    "malformed": ('{"name": "multiply", "parameters": {"a": 6,}}', '{"name": "multiply", "parameters": {"a": 6,}}', []),
    "valid_then_junk": ('{"name": "f", "parameters": {"a": 1}} and then text',
                        "and then text", [("f", {"a": 1})]),
    "valid_then_malformed": ('{"name": "f", "parameters": {}}; {"name": 3}', '{"name": 3}', [("f", {})]),
    "double_separator": ('{"name": "f", "parameters": {}};;{"name": "g", "parameters": {}}',
                         ';{"name": "g", "parameters": {}}', [("f", {})]),
    "leading_separator": ('<|python_tag|>;{"name": "f", "parameters": {}}', ';{"name": "f", "parameters": {}}', []),
    "not_a_call_object": ('{"answer": 42}', '{"answer": 42}', []),
    "no_call": ("The result is {6 * 7} = 42.", "The result is {6 * 7} = 42.", []),
    "truncated": ('<|python_tag|>{"name": "f", "param', '{"name": "f", "param', []),
    "empty": ("  ", None, []),
}

CASES = [(HermesToolParser, name, *case) for name, case in HERMES_CASES.items()] + \
        [(Llama3JsonToolParser, name, *case) for name, case in LLAMA_CASES.items()]
CASE_IDS = [f"{parser.name}-{name}" for parser, name, *_ in CASES]


def _summary(result: ExtractedToolCalls) -> tuple:
    return result.content, [(call.name, json.loads(call.arguments)) for call in result.tool_calls]


def _stream(parser, chunks: list[str]) -> ExtractedToolCalls:
    """Feed ``chunks`` and rebuild the output from the deltas, checking their shape on the way."""
    stream = parser.stream()
    content, calls = "", {}
    for delta in [d for chunk in chunks for d in stream.feed(chunk)] + stream.finish():
        assert len(delta) == 1, delta
        if "content" in delta:
            assert delta["content"], "empty content delta"
            content += delta["content"]
            continue
        (entry,) = delta["tool_calls"]
        index = entry["index"]
        if "id" in entry:  # header: first delta of a call, in index order
            assert index == len(calls) and entry["type"] == "function"
            assert entry["function"]["arguments"] == ""
            calls[index] = ToolCall(entry["function"]["name"], "", entry["id"])
        else:
            assert set(entry) == {"index", "function"} and set(entry["function"]) == {"arguments"}
            calls[index].arguments += entry["function"]["arguments"]
    assert [(c.name, c.id) for c in stream.tool_calls] == [(c.name, c.id) for c in calls.values()]
    return ExtractedToolCalls(content or None, list(calls.values()))


def _chunkings(text: str):
    """Every split into two, one character at a time, and seeded random chunkings."""
    yield [text]
    for i in range(1, len(text)):
        yield [text[:i], text[i:]]
    yield list(text)
    rng = random.Random(0)
    for _ in range(20):
        k = min(len(text) - 1, rng.randint(1, 8))
        cuts = sorted(rng.sample(range(1, len(text)), k)) if k > 0 else []
        yield [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]


def test_registry():
    assert TOOL_PARSERS == {"hermes": HermesToolParser, "llama3_json": Llama3JsonToolParser}
    assert all(cls.name == key for key, cls in TOOL_PARSERS.items())


@pytest.mark.parametrize("parser_cls,name,text,content,calls", CASES, ids=CASE_IDS)
def test_extract(parser_cls, name, text, content, calls):
    result = parser_cls().extract(text)
    assert _summary(result) == (content, calls)
    ids = [call.id for call in result.tool_calls]
    assert len(set(ids)) == len(ids) and all(i.startswith("call_") and len(i) > 5 for i in ids)


@pytest.mark.parametrize("parser_cls,name,text,content,calls", CASES, ids=CASE_IDS)
def test_stream_matches_extract_for_every_chunking(parser_cls, name, text, content, calls):
    parser = parser_cls()
    expected = _summary(parser.extract(text))
    for chunks in _chunkings(text):
        assert _summary(_stream(parser, chunks)) == expected, chunks


@pytest.mark.parametrize("parser_cls,name,text,content,calls", CASES, ids=CASE_IDS)
def test_stream_content_is_never_retracted(parser_cls, name, text, content, calls):
    """One character at a time, the content sent so far is always a prefix of the final content:
    no partial tag or undecided block ever reaches the client."""
    stream, sent = parser_cls().stream(), ""
    for char in text:
        sent += "".join(d.get("content", "") for d in stream.feed(char))
        assert (content or "").startswith(sent), (sent, content)


def test_hermes_streams_call_as_soon_as_block_closes():
    stream = HermesToolParser().stream()
    assert stream.feed("Sure. <tool_call>\n" + MUL[:20]) == [{"content": "Sure."}]
    assert stream.feed(MUL[20:] + "\n</tool") == []
    deltas = stream.feed("_call>")
    call_id = deltas[0]["tool_calls"][0]["id"]
    assert deltas == [
        {"tool_calls": [{"index": 0, "id": call_id, "type": "function",
                         "function": {"name": "multiply", "arguments": ""}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"a": 6, "b": 7}'}}]},
    ]
    assert stream.tool_calls == [ToolCall("multiply", '{"a": 6, "b": 7}', call_id)]
    assert stream.finish() == []


def test_hermes_holds_back_partial_tag_until_decided():
    stream = HermesToolParser().stream()
    assert stream.feed("x <tool_c") == [{"content": "x"}]
    assert stream.feed("all") == []
    assert stream.feed("er") == [{"content": " <tool_caller"}]
    assert stream.feed(" <tool") == []
    assert stream.finish() == [{"content": " <tool"}]


def test_llama3_streams_each_call_when_its_object_closes():
    stream = Llama3JsonToolParser().stream()
    assert stream.feed('<|python_tag|>{"name": "f", "parameters": {"a": {"b": 1}}') == []
    first = stream.feed("}; ")
    assert [d["tool_calls"][0]["index"] for d in first] == [0, 0]
    assert first[1]["tool_calls"][0]["function"]["arguments"] == '{"a": {"b": 1}}'
    assert stream.feed('{"name": "g", "parameters": {}}')[0]["tool_calls"][0]["function"]["name"] == "g"
    assert [c.name for c in stream.tool_calls] == ["f", "g"]


def test_llama3_plain_text_streams_without_waiting():
    stream = Llama3JsonToolParser().stream()
    assert stream.feed("Hello") == [{"content": "Hello"}]
    assert stream.feed(" <|python") == []
    assert stream.finish() == [{"content": " <|python"}]


def test_call_ids_are_fresh_per_call():
    texts = [HermesToolParser().extract(HERMES_CASES["one_call"][0]).tool_calls[0].id for _ in range(3)]
    assert len(set(texts)) == 3


def test_to_openai_shape():
    call = ToolCall("multiply", '{"a": 1}', "call_abc")
    assert call.to_openai() == {"id": "call_abc", "type": "function",
                                "function": {"name": "multiply", "arguments": '{"a": 1}'}}


@pytest.mark.parametrize("text,tag,expected", [
    ("abc <tool", "<tool_call>", ("abc ", "<tool")),
    ("abc <", "<tool_call>", ("abc ", "<")),
    ("abc <x", "<tool_call>", ("abc <x", "")),
    ("<tool_call", "<tool_call>", ("", "<tool_call")),
    ("", "<tool_call>", ("", "")),
])
def test_split_partial_tag(text, tag, expected):
    assert split_partial_tag(text, tag) == expected


def test_forced_parser_reads_complete_calls_of_a_cut_array():
    from graphllm.server.tool_parsers import ForcedToolParser, complete_array_items
    assert complete_array_items('[{"a": 1}, {"b": [2, 3]} , {"c"') == [{"a": 1}, {"b": [2, 3]}]
    assert complete_array_items(' [ ]') == [] and complete_array_items('{"a": 1}') == []
    cut = '[{"name": "f", "parameters": {"x": 1}}, {"name": "f", "param'
    assert [(c.name, c.arguments) for c in ForcedToolParser().extract(cut).tool_calls] == [("f", '{"x": 1}')]
    named = ForcedToolParser("g").extract('{"y": 2}')
    assert [(c.name, c.arguments) for c in named.tool_calls] == [("g", '{"y": 2}')] and named.content is None
    cut_named = ForcedToolParser("g").extract(' {"y": ')  # max_tokens ended it: the partial text, as written
    assert [(c.name, c.arguments) for c in cut_named.tool_calls] == [("g", '{"y":')]
    stream = ForcedToolParser("g").stream()
    deltas = [d for piece in (" ", '{"y"', ": 2", "} ") for d in stream.feed(piece)] + stream.finish()
    assert deltas[0]["tool_calls"][0]["function"] == {"name": "g", "arguments": ""}
    assert "".join(d["tool_calls"][0]["function"]["arguments"] for d in deltas[1:]) == '{"y": 2}'
    assert len(deltas) == 4 and [c.arguments for c in stream.tool_calls] == ['{"y": 2}']
