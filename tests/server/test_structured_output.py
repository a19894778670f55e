"""Structured output over HTTP with the official openai client, on the demo model: response_format
(json_object, json_schema), vLLM's structured_outputs and guided_* fields on chat and completions,
streamed and whole; a grammar that does not compile, an unknown field or two grammars at once is a
400 in OpenAI's error shape, and the server keeps serving."""

import json
import random
import re

import jsonschema
import openai
import pytest

from tests.server.conftest import MODEL

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "minimum": 0,
                                                                         "maximum": 120}}}
CHAT = [{"role": "user", "content": "Tell me about a person."}]


@pytest.fixture(autouse=True)
def demo_only(server):
    if server.engine.state.model_path.name != "demo_model":
        pytest.skip("needs the demo model's byte-level vocabulary")


def check_person(text: str) -> None:
    value = json.loads(text)
    assert set(value) == {"name", "age"} and isinstance(value["name"], str) and len(value["name"]) <= 8
    assert isinstance(value["age"], int) and 0 <= value["age"] <= 120


def test_response_format_json_schema_whole_and_streamed(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}
    for seed in range(3):
        out = client.chat.completions.create(model=MODEL, messages=CHAT, response_format=fmt, temperature=1.0,
                                             seed=seed, max_tokens=120,
                                             extra_body={"structured_outputs": None})
        check_person(out.choices[0].message.content)
        assert out.choices[0].finish_reason == "stop"
    stream = client.chat.completions.create(model=MODEL, messages=CHAT, response_format=fmt, temperature=1.0,
                                            seed=5, max_tokens=120, stream=True)
    check_person("".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices))


def test_response_format_json_object_is_an_object(client):
    out = client.chat.completions.create(model=MODEL, messages=CHAT, response_format={"type": "json_object"},
                                         temperature=0, max_tokens=300)
    text = out.choices[0].message.content
    assert text.lstrip().startswith("{")
    if out.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)


@pytest.mark.parametrize("extra, check", [
    ({"guided_regex": r"[A-Z][a-z]{2,5} \d{2}"}, lambda t: re.fullmatch(r"[A-Z][a-z]{2,5} \d{2}", t)),
    ({"guided_choice": ["red", "green", "blue"]}, lambda t: t in ("red", "green", "blue")),
    ({"guided_grammar": 'root ::= "(" [0-9] [0-9]? ("+" [0-9])? ")"'}, lambda t: re.fullmatch(r"\(\d\d?(\+\d)?\)", t)),
    ({"guided_json": SCHEMA}, lambda t: check_person(t) is None),
    ({"structured_outputs": {"choice": ["yes", "no"]}}, lambda t: t in ("yes", "no")),
    ({"structured_outputs": {"json": SCHEMA, "disable_any_whitespace": True}},
     lambda t: check_person(t) is None and "\n" not in t),
])
def test_vllm_fields_on_completions_and_chat(client, extra, check):
    done = client.completions.create(model=MODEL, prompt="The answer:", max_tokens=60, temperature=0.7, seed=1,
                                     extra_body=extra)
    assert check(done.choices[0].text), done.choices[0].text
    chat = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=60, temperature=0.7, seed=2,
                                          extra_body=extra)
    assert check(chat.choices[0].message.content), chat.choices[0].message.content


@pytest.mark.parametrize("extra, param, words", [
    ({"guided_regex": "(unclosed"}, "guided_regex", "does not compile"),
    ({"structured_outputs": {"json": {"type": "object"}, "whitespace_pattern": " "}}, "structured_outputs",
     "unsupported fields"),
    ({"structured_outputs": {}}, "structured_outputs", "exactly one of"),
    ({"guided_choice": ["a"], "response_format": {"type": "json_object"}}, "guided_choice",
     "one structured output per request"),
    ({"response_format": {"type": "json_schema"}}, "response_format", "json_schema.schema"),
])
def test_bad_grammars_are_400s_and_the_server_keeps_serving(client, extra, param, words):
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model=MODEL, prompt="Hi", max_tokens=4, stream=stream, extra_body=extra)
        assert e.value.body["param"] == param and words in e.value.message
    ok = client.completions.create(model=MODEL, prompt="Hi", max_tokens=2)
    assert ok.choices[0].finish_reason in ("length", "stop")


def random_schema(rng: random.Random, depth: int = 0) -> dict:
    """A JSON schema of bounded size: objects (required and optional properties), arrays, enums, strings,
    integers and numbers with bounds, booleans; nested up to two levels."""
    kinds = ["string", "integer", "number", "boolean", "enum"] + (["object", "array"] if depth < 2 else [])
    kind = rng.choice(kinds)
    if kind == "string":
        return {"type": "string", "maxLength": rng.randint(1, 6)}
    if kind == "integer":
        low = rng.randint(-50, 50)
        return {"type": "integer", "minimum": low, "maximum": low + rng.randint(0, 100)}
    if kind == "number":
        return {"type": "number", "minimum": -10, "maximum": rng.choice([1, 10, 100])}
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "enum":
        return {"enum": rng.sample(["a", "b", "c", 1, 2, True, None], rng.randint(1, 4))}
    if kind == "array":
        return {"type": "array", "items": random_schema(rng, depth + 1), "minItems": rng.randint(0, 1),
                "maxItems": rng.randint(1, 3)}
    names = rng.sample(["id", "name", "tags", "size", "ok", "kind", "meta"], rng.randint(1, 4))
    return {"type": "object", "additionalProperties": False,
            "properties": {n: random_schema(rng, depth + 1) for n in names},
            "required": rng.sample(names, rng.randint(0, len(names)))}


def test_fifty_generated_schemas_validate(client):
    """Through the server and openai: 50 seeded schemas, each output parses and validates (jsonschema)."""
    rng = random.Random(0)
    for i in range(50):
        schema = {"type": "object", "additionalProperties": False, "required": ["value"],
                  "properties": {"value": random_schema(rng)}}
        out = client.completions.create(model=MODEL, prompt="JSON:", max_tokens=400, temperature=1.0, seed=i,
                                         extra_body={"guided_json": schema})
        choice = out.choices[0]
        assert choice.finish_reason == "stop", (i, schema, choice.text)
        jsonschema.validate(json.loads(choice.text), schema)


def test_a_grammar_that_cannot_finish_in_max_tokens_ends_with_length(client):
    out = client.completions.create(model=MODEL, prompt="Hi", max_tokens=5, extra_body={"guided_regex": "a{40}"})
    assert out.choices[0].finish_reason == "length" and out.choices[0].text == "a" * 5
    assert client.completions.create(model=MODEL, prompt="Hi", max_tokens=2).choices[0].text is not None
