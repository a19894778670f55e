"""Hostile input (issue 17): every field that sizes an allocation is bounded before anything is
allocated, non-finite floats and incomplete tool messages are refused, a body too large for the
context is refused before it is tokenized, and the server keeps answering /health meanwhile."""

import json
import logging
import sys
import threading
import time

import pytest

from graphllm.server.serving_engine import max_token_bytes
from tests.server.conftest import MODEL, start
from tests.server.test_errors import check_shape

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "What is 2 plus 3?"}], "max_tokens": 2}
COMPLETION = {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 2}


@pytest.fixture(autouse=True)
def still_serving(server):
    yield
    assert server.get("/health", auth=False).status_code == 200
    assert server.post("/v1/completions", COMPLETION).status_code == 200


def post_while_healthy(server, path: str, body, **kwargs):
    """POST body from a thread, asking /health every few tens of milliseconds meanwhile: each answer must come
    within a second (the body is handled off the event loop). The POST's response."""
    result = {}
    thread = threading.Thread(target=lambda: result.update(r=server.post(path, body, **kwargs)))
    thread.start()
    while thread.is_alive():
        began = time.monotonic()
        assert server.get("/health", auth=False).status_code == 200
        assert time.monotonic() - began < 1.0
        time.sleep(0.02)
    thread.join()
    return result["r"]


@pytest.mark.parametrize("field, value", [("n", 17592186044416), ("n", 129), ("n", 0), ("best_of", 10**9)])
def test_sizes_past_the_limits_are_refused_before_any_allocation(server, field, value):
    start = time.monotonic()
    error = check_shape(server.post("/v1/completions", {**COMPLETION, field: value}), 400, field)
    assert "--max-n" in error["message"] and time.monotonic() - start < 2  # refused, not allocated


def test_list_fields_are_bounded(server):
    check_shape(server.post("/v1/completions", {**COMPLETION, "stop": ["x"] * 65}), 400, "stop")
    check_shape(server.post("/v1/completions", {**COMPLETION, "stop_token_ids": [1] * 65}), 400, "stop_token_ids")
    check_shape(server.post("/v1/completions", {**COMPLETION, "prompt": [[1, 2]] * 257}), 400, "prompt")
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    check_shape(server.post("/v1/chat/completions", {**CHAT, "tools": [tool] * 129}), 400, "tools")


@pytest.mark.parametrize("raw", ['Infinity', '-Infinity', 'NaN', '1e999'])
@pytest.mark.parametrize("field", ["temperature", "top_p", "presence_penalty", "min_p"])
def test_non_finite_floats_are_refused(server, raw, field):
    body = '{"model": "%s", "prompt": [1, 2, 3], "max_tokens": 2, "%s": %s}' % (MODEL, field, raw)
    error = check_shape(server.post("/v1/completions", body.encode()), 400, field)
    assert "finite" in error["message"]


def test_tool_message_without_tool_call_id_is_refused(server):
    messages = [{"role": "user", "content": "3 times 4?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "multiply", "arguments": "{}"}}]},
                {"role": "tool", "content": "12"}]
    check_shape(server.post("/v1/chat/completions", {**CHAT, "messages": messages}), 400, "messages.2.tool_call_id")


def test_a_context_sized_body_is_refused_before_tokenizing_and_health_stays_up(request, engine):
    """A body far past max_model_len (100 MB would not fit the body limit; the check is on bytes per
    token) is a 400 at once, and /health answers within a second while it is parsed."""
    big = start(request, engine, max_body_bytes=64 * 2**20)
    text = "seven times eight " * (10 * 2**20 // 18)  # ~10 MB
    began = time.monotonic()
    response = post_while_healthy(big, "/v1/chat/completions",
                                  {**CHAT, "messages": [{"role": "user", "content": text}]}, timeout=60)
    check_shape(response, 400, "messages", "context_length_exceeded")
    assert time.monotonic() - began < 10
    check_shape(big.post("/v1/completions", {**COMPLETION, "prompt": text}), 400, "prompt", "context_length_exceeded")
    check_shape(big.post("/tokenize", {"model": MODEL, "prompt": text}), 400, "prompt", "context_length_exceeded")


def test_a_body_cut_off_by_its_client_counts_as_499_not_400(server):
    """Regression: a client that leaves while sending its body (the soak's aborting clients) was
    counted as a 400 ("error parsing the body") in the metrics; it is a client-closed request."""
    import socket

    from tests.server.conftest import API_KEY
    key = 'graphllm:http_requests_total{endpoint="/v1/completions",status="%s"}'
    before = server.metrics()
    host, port = server.base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Authorization: Bearer " + API_KEY.encode() + b"\r\nContent-Length: 1000\r\n\r\n{\"prompt\":")
    deadline = time.monotonic() + 5
    while server.metrics().get(key % 499, 0) == before.get(key % 499, 0):
        assert time.monotonic() < deadline, "the cut-off request was not counted"
        time.sleep(0.05)
    assert server.metrics().get(key % 400, 0) == before.get(key % 400, 0)


def test_tokenize_of_an_empty_prompt_is_not_a_500(server):
    """Regression: the size check before tokenizing read `messages` when the prompt was empty text."""
    response = server.post("/tokenize", {"model": MODEL, "prompt": ""})
    assert response.status_code == 200 and response.json()["count"] == len(response.json()["tokens"])


@pytest.mark.parametrize("path, body, param", [
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "\\ud800"}]}', "messages.0.content"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": [{"type": "text", "text": "a\\udc00"}]}]}',
     "messages.0.content.0.text"),
    ("/v1/completions", '{"prompt": "\\udfff", "max_tokens": 2}', "prompt"),
    ("/v1/completions", '{"prompt": ["ok", "\\ud800"], "max_tokens": 2, "stream": true}', "prompt.1"),
    ("/v1/completions", '{"model": "\\ud800", "prompt": [1, 2], "max_tokens": 2}', "model"),
    ("/tokenize", '{"prompt": "\\udfff"}', "prompt"),
])
def test_lone_surrogates_are_a_400_naming_the_field(server, path, body, param):
    """Regression (s35's fuzzing): JSON may escape a lone UTF-16 surrogate ("\\ud800"), which decodes to text UTF-8
    cannot encode; encoding it for the length check, the tokenizer or the error message was a 500 (and uvicorn
    dropped the connection). A surrogate pair is a character and passes."""
    error = check_shape(server.post(path, body.encode()), 400, param)
    assert "surrogate" in error["message"]
    pair = server.post("/v1/completions", b'{"prompt": "\\ud83d\\ude80", "max_tokens": 2}')
    assert pair.status_code == 200, pair.text


UNBOUNDED_TEMPLATE = "{{ 'a' * 100000000 }}"  # 100 MB of prompt from one line: a template is a program


@pytest.mark.parametrize("body", [{"chat_template_kwargs": {"chat_template": UNBOUNDED_TEMPLATE}},
                                  {"chat_template": UNBOUNDED_TEMPLATE}])
def test_a_requests_own_chat_template_is_refused_unless_trusted(server, body):
    """Regression (s35's fuzzing): chat_template_kwargs.chat_template replaced the model's template, and this one
    line rendered 100 MB that the tokenizer then took minutes and ~18 GB over, uncancellable. As vLLM: a 400
    unless the server runs with --trust-request-chat-template."""
    began = time.monotonic()
    error = check_shape(server.post("/v1/chat/completions", {**CHAT, **body}), 400,
                        "chat_template_kwargs.chat_template")
    assert "--trust-request-chat-template" in error["message"] and time.monotonic() - began < 5


def test_a_trusted_server_renders_the_requests_chat_template(request, engine):
    trusting = start(request, engine, trust_request_chat_template=True)
    template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    response = trusting.post("/v1/chat/completions", {**CHAT, "chat_template": template})
    assert response.status_code == 200, response.text
    expected = engine.tokenizer.encode("<user>What is 2 plus 3?", add_special_tokens=False)
    assert response.json()["usage"]["prompt_tokens"] == len(expected)


@pytest.mark.parametrize("key, value", [("tokenizer_kwargs", {"padding": "max_length", "max_length": 10**8}),
                                        ("max_length", 10**8), ("tokenize", False), ("tools", [])])
def test_apply_chat_template_parameters_in_chat_template_kwargs_are_refused(server, key, value):
    """chat_template_kwargs carry template variables; apply_chat_template's own parameters are the server's (padding
    to 10**8 tokens would have allocated them)."""
    check_shape(server.post("/v1/chat/completions", {**CHAT, "chat_template_kwargs": {key: value}}), 400,
                f"chat_template_kwargs.{key}")
    variable = server.post("/v1/chat/completions", {**CHAT, "chat_template_kwargs": {"enable_thinking": False}})
    assert variable.status_code == 200, variable.text


def test_tool_definitions_and_call_arguments_count_toward_the_length_check(server):
    """Regression (s35's fuzzing): the bytes-per-token check before templating counted only message content, so an
    8 MB tool description or call argument was rendered and tokenized (~10 s) before it was refused. Now it is
    refused on its bytes ('bytes of text'), as content is."""
    description = "word " * 20_000  # ~100 KB: past the demo's 1,024 tokens at 64 bytes a token at most
    tool = {"type": "function", "function": {"name": "f", "description": description}}
    for path, body in (("/v1/chat/completions", {**CHAT, "tools": [tool]}),
                       ("/tokenize", {"model": MODEL, "messages": CHAT["messages"], "tools": [tool]})):
        error = check_shape(server.post(path, body), 400, "messages", "context_length_exceeded")
        assert "bytes of text" in error["message"], error["message"]
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": description}}
    messages = [*CHAT["messages"], {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "ok"}]
    error = check_shape(server.post("/v1/chat/completions", {**CHAT, "messages": messages}), 400, "messages",
                        "context_length_exceeded")
    assert "bytes of text" in error["message"], error["message"]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path, body", [("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT)])
def test_stop_token_ids_outside_the_vocabulary_are_a_400_before_any_answer(server, path, body, stream):
    """Regression (s37's fuzzing): only the engine checked stop_token_ids against the vocabulary, so a streamed
    request got its 200 and then an error event, and a whole one a 400 naming no field."""
    vocab = server.engine.state.model_config.vocab_size
    error = check_shape(server.post(path, {**body, "stop_token_ids": [1, vocab], "stream": stream}), 400,
                        "stop_token_ids")
    assert str(vocab) in error["message"]


def test_more_messages_than_the_context_holds_are_refused_before_templating(server):
    """Regression (s37's fuzzing): the length check before templating counted only text bytes, so 500,000 empty
    messages (a 16 MB body) were templated and tokenized to 1,000,000 tokens (10 s) before the 400, and six such
    requests held every thread the engine steps in (a 2-token answer took 20 s). Every message renders at least one
    token (its role's markers)."""
    limit = server.engine.state.max_model_len
    messages = [{"role": "user", "content": ""}] * limit
    for path in ("/v1/chat/completions", "/tokenize"):
        error = check_shape(server.post(path, {**CHAT, "messages": messages}), 400, "messages",
                            "context_length_exceeded")
        assert f"{limit} messages" in error["message"], error["message"]


def test_content_parts_count_their_separators_toward_the_length_check(request, engine):
    """Regression (s37's fuzzing): text parts are joined with newlines, which the length check did not count, so
    half a million empty parts reached the template and tokenizer (4 s) before the 400."""
    big = start(request, engine, max_body_bytes=8 * 2**20)
    parts = [{"type": "text", "text": ""}] * (engine.state.max_model_len * max_token_bytes(engine.tokenizer) + 1)
    error = check_shape(big.post("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": parts}]}),
                        400, "messages", "context_length_exceeded")
    assert "bytes of text" in error["message"], error["message"]


def test_a_prompt_batch_is_refused_at_its_first_prompt_past_the_context(server):
    """Regression (s37's fuzzing): every prompt of a batch was tokenized before any was checked against the context,
    so 256 prompts of 64 KB each (16 MB, each under the bytes-per-token bound) took 7 s of tokenizing before the 400,
    and six such requests held every thread the engine steps in (a 2-token answer took 32 s). Each prompt is now
    checked as it is tokenized: here the second, empty, prompt is never reached."""
    limit = server.engine.state.max_model_len
    long = "seven times eight " * ((limit - 1) * max_token_bytes(server.engine.tokenizer) // 18)
    error = check_shape(server.post("/v1/completions", {**COMPLETION, "prompt": [long, ""]}), 400, "prompt",
                        "context_length_exceeded")
    assert "resulted in" in error["message"], error["message"]


def test_a_large_structured_body_does_not_hold_the_event_loop(request, engine):
    """Regression (s37's fuzzing): the check for lone surrogates walked every node of a body in Python on the event
    loop, so 8 MB of empty objects in an ignored field stopped /health for 2 s (the walk now runs only when a
    C-speed check finds such text)."""
    big = start(request, engine, max_body_bytes=16 * 2**20)
    body = json.dumps({**COMPLETION, "padding": [{}] * (2 * 2**20)}).encode()
    response = post_while_healthy(big, "/v1/completions", body)
    assert response.status_code == 200, response.text


def test_tokenize_renders_messages_as_the_chat_route_does(request, engine, server):
    """Regression (s37's fuzzing): /tokenize ignored chat_template and chat_template_kwargs (vLLM's fields there too),
    so it counted another prompt than the chat route ran, and took a template an untrusting server refuses."""
    messages = CHAT["messages"]
    check_shape(server.post("/tokenize", {"messages": messages, "chat_template": UNBOUNDED_TEMPLATE}), 400,
                "chat_template_kwargs.chat_template")
    check_shape(server.post("/tokenize", {"messages": messages, "chat_template_kwargs": {"tokenize": False}}), 400,
                "chat_template_kwargs.tokenize")
    trusting = start(request, engine, trust_request_chat_template=True)
    template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{{ suffix }}"
    for body in ({"chat_template": template}, {"chat_template": template, "chat_template_kwargs": {"suffix": "ok"}}):
        tokens = trusting.post("/tokenize", {"messages": messages, **body}).json()["tokens"]
        chat = trusting.post("/v1/chat/completions", {**CHAT, **body}).json()
        assert len(tokens) == chat["usage"]["prompt_tokens"], body


def nested(depth: int) -> dict:
    value = {"a": 1}
    for _ in range(depth):
        value = {"a": value}
    return value


@pytest.fixture
def default_recursion_limit():
    """Python's default recursion limit (1,000) for the test: Inductor raises it when it compiles, and earlier
    tests of a full run compile in this process (with it raised, 600 levels render and only the length check is
    left). The server runs in this process's threads, so it sees the same limit."""
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)
    yield
    sys.setrecursionlimit(before)


@pytest.mark.parametrize("where", ["arguments", "tools", "chat_template_kwargs"])
def test_deeply_nested_template_input_is_a_400_not_a_500(server, where, default_recursion_limit):
    """Regression (s37's fuzzing): transformers copies what the chat template gets recursively, so 600 levels of
    nesting (which the body's JSON parser takes) were a RecursionError and a 500; and tool-call arguments as text
    were parsed with json.loads catching ValueError only, so 2,000 levels there were one too (that text now goes to
    the template as it is)."""
    bodies = {"tools": {"tools": [{"type": "function", "function": {"name": "f", "parameters": nested(600)}}]},
              "chat_template_kwargs": {"chat_template_kwargs": {"x": nested(600)}}}
    for path in ("/v1/chat/completions", "/tokenize"):
        body = {**CHAT, **bodies[where]} if where in bodies else {**CHAT, "messages": with_call(nested(600))}
        error = check_shape(server.post(path, body), 400, "messages")
        assert "nested too deeply" in error["message"], error["message"]
        if where == "arguments":
            response = server.post(path, {**CHAT, "messages": with_call("[" * 2000 + "]" * 2000)})
            assert response.status_code < 500, response.text


def with_call(arguments) -> list[dict]:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    return [*CHAT["messages"], {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"}]


def test_unknown_fields_are_logged_in_a_bounded_line(server, caplog):
    """Regression (s37's fuzzing): every unknown field name went into one warning, so a 16 MB body of a million
    unknown keys wrote 12 MB to the log per request."""
    body = {**COMPLETION, "x" * 10_000: 1, **{f"field{i}": 0 for i in range(1_000)}}
    with caplog.at_level(logging.WARNING, logger="graphllm.server"):
        assert server.post("/v1/completions", body).status_code == 200
    [record] = [r for r in caplog.records if "unknown request fields" in r.getMessage()]
    assert len(record.getMessage()) < 1_000 and "1001" in record.getMessage(), record.getMessage()[:200]


def test_openais_user_field_is_accepted_without_a_warning(server, caplog):
    """`user` (OpenAI's end-user id) is a standard field: it was logged as an unknown field on every request."""
    with caplog.at_level(logging.WARNING, logger="graphllm.server"):
        assert server.post("/v1/completions", {**COMPLETION, "user": "user-1234"}).status_code == 200
    assert not [r for r in caplog.records if "unknown request fields" in r.getMessage()]
