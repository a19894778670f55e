"""Hostile input (issue 17): every field that sizes an allocation is bounded before anything is
allocated, non-finite floats and incomplete tool messages are refused, a body too large for the
context is refused before it is tokenized, and the server keeps answering /health meanwhile."""

import threading
import time

import pytest

from tests.server.conftest import MODEL, start
from tests.server.test_errors import check_shape

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "What is 2 plus 3?"}], "max_tokens": 2}
COMPLETION = {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 2}


@pytest.fixture(autouse=True)
def still_serving(server):
    yield
    assert server.get("/health", auth=False).status_code == 200
    assert server.post("/v1/completions", COMPLETION).status_code == 200


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
    result = {}
    thread = threading.Thread(target=lambda: result.update(r=big.post(
        "/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": text}]}, timeout=60)))
    began = time.monotonic()
    thread.start()
    while thread.is_alive():
        t = time.monotonic()
        assert big.get("/health", auth=False).status_code == 200
        assert time.monotonic() - t < 1.0
        time.sleep(0.05)
    thread.join()
    check_shape(result["r"], 400, "messages", "context_length_exceeded")
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
