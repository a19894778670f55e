"""A speculative engine behind the real server (uvicorn on 127.0.0.1, the official openai client), the demo
model proposing for itself: answers equal a plain engine's, structured outputs hold under speculation, and
/metrics counts the proposals."""

import json

import pytest

from graphllm.config import EngineConfig
from graphllm.demo import DEMO_MODEL_DIR
from graphllm.runtime.engine import Engine
from tests.server.conftest import MODEL, start

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 8},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120}}}
CHAT = [{"role": "user", "content": "What is 17 plus 25?"}]


@pytest.fixture(scope="module")
def spec_server(request):
    engine = Engine(EngineConfig(speculative_config={"model": str(DEMO_MODEL_DIR), "num_speculative_tokens": 3}))
    return start(request, engine)


def test_greedy_answers_equal_the_plain_servers(spec_server, client):
    spec = spec_server.client()
    for messages in (CHAT, [{"role": "user", "content": "What is 40 minus 13?"}]):
        want = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=32)
        got = spec.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=32)
        assert got.choices[0].message.content == want.choices[0].message.content
        assert got.usage.completion_tokens == want.usage.completion_tokens
    metrics = spec_server.metrics()
    assert metrics["graphllm:spec_decode_num_draft_tokens_total"] > 0
    assert metrics["graphllm:spec_decode_num_accepted_tokens_total"] > 0


def test_json_schema_under_speculation_whole_and_streamed(spec_server):
    spec = spec_server.client()
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}
    for seed in range(2):
        out = spec.chat.completions.create(model=MODEL, messages=CHAT, response_format=fmt, temperature=1.0,
                                           seed=seed, max_tokens=120)
        value = json.loads(out.choices[0].message.content)
        assert set(value) == {"name", "age"} and out.choices[0].finish_reason == "stop"
    stream = spec.chat.completions.create(model=MODEL, messages=CHAT, response_format=fmt, temperature=0,
                                          max_tokens=120, stream=True)
    value = json.loads("".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices))
    assert set(value) == {"name", "age"}
