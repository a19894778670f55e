"""Every error answers in OpenAI's shape with its status, maps to the right openai exception class,
and leaves the server serving."""

import openai
import pytest

from tests.server.conftest import MAX_BODY_BYTES, MODEL

MESSAGES = [{"role": "user", "content": "What is 2 plus 3?"}]
ERROR_KEYS = {"message", "type", "param", "code"}


@pytest.fixture(autouse=True)
def still_serving(server):
    yield
    assert server.get("/health").status_code == 200
    out = server.client().completions.create(model=MODEL, prompt=[1, 2, 3], max_tokens=1)
    assert len(out.choices) == 1


def check_shape(response, status: int, param: str | None = None, code: str | None = None) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == ERROR_KEYS
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert body["error"]["param"] == param and body["error"]["code"] == code
    return body["error"]


def raises(cls, call) -> openai.APIStatusError:
    with pytest.raises(openai.APIStatusError) as e:
        call()
    assert type(e.value) is cls
    assert set(e.value.body) == ERROR_KEYS  # the client hands over the "error" object
    return e.value


def test_invalid_sampling_parameter_is_400(server, client):
    e = raises(openai.BadRequestError, lambda: client.chat.completions.create(
        model=MODEL, messages=MESSAGES, temperature=-1))
    assert e.status_code == 400 and e.body["param"] == "temperature"
    check_shape(server.post("/v1/completions", {"prompt": "x", "top_p": 0}), 400, "top_p")


def test_validation_errors_are_400_never_422(server, client):
    e = raises(openai.BadRequestError, lambda: client.chat.completions.create(
        model=MODEL, messages=MESSAGES, temperature="hot"))
    assert e.body["param"] == "temperature"
    check_shape(server.post("/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}), 400,
                "messages.0.role")
    check_shape(server.post("/v1/chat/completions", {"model": MODEL}), 400, "messages")
    check_shape(server.post("/v1/chat/completions", {"messages": MESSAGES, "stream": "often"}), 400, "stream")
    check_shape(server.post("/v1/completions", b"{not json"), 400)
    check_shape(server.post("/v1/completions", {"prompt": []}), 400, "prompt")


def test_prompt_longer_than_max_model_len_is_400(server, client):
    limit = server.engine.state.max_model_len
    e = raises(openai.BadRequestError, lambda: client.completions.create(model=MODEL, prompt=[5] * limit))
    assert e.body["code"] == "context_length_exceeded"
    e = raises(openai.BadRequestError, lambda: client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=limit))
    assert e.body["code"] == "context_length_exceeded" and e.body["param"] == "max_tokens"
    check_shape(server.post("/v1/completions", {"prompt": [5] * limit}), 400, "prompt", "context_length_exceeded")


def test_missing_or_wrong_api_key_is_401(server):
    e = raises(openai.AuthenticationError, lambda: server.client(api_key="wrong").models.list())
    assert e.body["code"] == "invalid_api_key"
    check_shape(server.post("/v1/chat/completions", {"messages": MESSAGES}, auth=False), 401, None,
                "invalid_api_key")
    assert server.get("/health").status_code == 200  # open without a key, like vLLM


def test_unknown_model_is_404(server, client):
    e = raises(openai.NotFoundError, lambda: client.chat.completions.create(model="gpt-9", messages=MESSAGES))
    assert e.body["code"] == "model_not_found" and e.body["param"] == "model"
    raises(openai.NotFoundError, lambda: client.completions.create(model="gpt-9", prompt="x"))
    raises(openai.NotFoundError, lambda: client.models.retrieve("gpt-9"))
    assert client.chat.completions.create(model="alias", messages=MESSAGES, max_tokens=1).model == MODEL


def test_oversized_body_is_413(server, client):
    big = "x" * (MAX_BODY_BYTES + 1)
    e = raises(openai.APIStatusError, lambda: client.completions.create(model=MODEL, prompt=big))
    assert e.status_code == 413 and e.body["code"] == "request_too_large"

    def chunked():  # no Content-Length: the limit is enforced while reading
        yield b'{"prompt": "'
        for _ in range(MAX_BODY_BYTES // 1024 + 1):
            yield b"x" * 1024
        yield b'"}'
    check_shape(server.post("/v1/completions", chunked()), 413, None, "request_too_large")


def test_an_unknown_response_format_is_400(server, client):
    e = raises(openai.BadRequestError, lambda: client.chat.completions.create(
        model=MODEL, messages=MESSAGES, response_format={"type": "xml"}))
    assert e.body["param"] == "response_format.type"
    out = client.chat.completions.create(model=MODEL, messages=MESSAGES, response_format={"type": "text"},
                                         max_tokens=2)
    assert out.choices[0].message.content is not None


def test_unsupported_and_contradictory_fields_are_400(server, client):
    for kwargs in ({"logit_bias": {"w5": 10}}, {"logit_bias": {"999999999": 1}}, {"stream_options": {"include_usage": True}},
                   {"logprobs": False, "top_logprobs": 2}, {"tool_choice": "required"},
                   {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
                   {"tools": [{"type": "function", "function": {"name": "f"}}],
                    "tool_choice": {"type": "function", "function": {"name": "g"}}}):
        raises(openai.BadRequestError, lambda: client.chat.completions.create(
            **{"model": MODEL, "messages": MESSAGES, **kwargs}))
    raises(openai.BadRequestError, lambda: client.completions.create(model=MODEL, prompt="x", echo=True,
                                                                      logprobs=1))
    raises(openai.BadRequestError, lambda: client.completions.create(model=MODEL, prompt=[10**9]))


def test_unknown_route_is_404_in_openai_shape(server):
    check_shape(server.get("/nothing-here"), 404)
    check_shape(server.post("/v1/nothing-here", {}), 404)


def test_a_text_part_without_text_is_named(server):
    """Regression (s37's fuzzing): a text part without its text was refused as 'only text parts are supported, got
    'text''."""
    content = [{"type": "text", "text": "What is 2 plus 3?"}, {"type": "text"}]
    error = check_shape(server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": content}]}),
                        400, "messages.0.content.1.text")
    assert "text" in error["message"] and "only text parts" not in error["message"]


@pytest.mark.parametrize("body, headers, words", [
    (b'{"prompt": "caf\xe9", "max_tokens": 1}', {}, "UTF-8"),
    (b"[" * 100_000 + b"]" * 100_000, {}, "nested"),
    (b'{"prompt": [1, 2, 3], "max_tokens": 1}', {"content-type": "text/plain"}, "Content-Type: application/json"),
    (b"[1, 2, 3]", {}, "JSON object"),
], ids=["not-utf8", "too-deep", "not-json-content-type", "an-array"])
def test_a_body_that_does_not_parse_to_an_object_is_named(server, body, headers, words):
    """Regression (s37's fuzzing): a body that is not UTF-8 or nests past the parser's depth got FastAPI's 'There was
    an error parsing the body', and one sent without a JSON Content-Type 'body: Input should be a valid
    dictionary'."""
    error = check_shape(server.post("/v1/completions", body, headers=headers), 400)
    assert words in error["message"], error["message"]
