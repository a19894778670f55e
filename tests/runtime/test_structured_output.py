"""Structured output (runtime/structured_output.py, xgrammar) on the built-in demo model, whose byte-level
BPE vocabulary can spell any text: every kind of grammar constrains what a random-ish model writes, in
host and device sampling, sync and async, greedy and seeded, with queued decode steps asked for."""

import json
import re

import pytest

from graphllm import Engine, SamplingParams
from graphllm.runtime.structured_output import StructuredOutputsParams as SO
from graphllm.runtime.structured_output import choice_grammar

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["ok", "n", "color"],
          "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 99},
                         "color": {"enum": ["red", "green", "blue"]}}}
PROMPTS = ["Hello there", "What is 2 plus 2?"]


@pytest.fixture(scope="module")
def engine():
    return Engine.from_pretrained()


def texts(engine, so: SO, **params) -> list[tuple[str, str]]:
    outs = engine.generate(PROMPTS, SamplingParams(max_tokens=48, structured_outputs=so, **params))
    assert engine.pool.num_free_blocks == engine.pool.num_blocks
    return [(c.text, c.finish_reason) for o in outs for c in o.outputs]


def check_schema(text: str) -> None:
    value = json.loads(text)
    assert set(value) == {"ok", "n", "color"} and isinstance(value["ok"], bool)
    assert isinstance(value["n"], int) and 0 <= value["n"] <= 99 and value["color"] in ("red", "green", "blue")


@pytest.mark.parametrize("sampling", [{"temperature": 0.0}, {"temperature": 1.0, "seed": 7, "n": 2},
                                      {"temperature": 0.8, "seed": 3, "logprobs": 2}])
def test_every_kind_of_grammar_is_obeyed(engine, sampling):
    for text, reason in texts(engine, SO(json=SCHEMA, disable_any_whitespace=True), **sampling):
        check_schema(text)
        assert reason == "stop"
    for text, reason in texts(engine, SO(regex=r"[a-c]{3}-\d\d"), **sampling):
        assert re.fullmatch(r"[a-c]{3}-\d\d", text) and reason == "stop"
    for text, _ in texts(engine, SO(choice=["yes", "no", 'say "maybe"']), **sampling):
        assert text in ("yes", "no", 'say "maybe"')
    for text, _ in texts(engine, SO(grammar='root ::= "x" [0-9] [0-9]? "y"'), **sampling):
        assert re.fullmatch(r"x\d\d?y", text)
    for text, reason in texts(engine, SO(json_object=True), **sampling):
        assert text.startswith("{") and (reason == "length" or isinstance(json.loads(text), dict))


def test_the_grammar_changes_what_the_model_writes(engine):
    free = engine.generate(PROMPTS, SamplingParams(max_tokens=12, temperature=0.0))
    assert not any(re.fullmatch(r"[a-c]{3}-\d\d", o.outputs[0].text) for o in free)


def test_same_tokens_sync_and_async_and_with_queued_decode_steps(engine):
    params = SamplingParams(max_tokens=40, temperature=0.9, seed=11, n=2,
                            structured_outputs=SO(json=SCHEMA, disable_any_whitespace=True))
    want = [c.token_ids for o in engine.generate(PROMPTS, params) for c in o.outputs]
    for options in ({"async_scheduling": False}, {"num_decode_steps": 4}):
        other = Engine.from_pretrained(**options)
        assert [c.token_ids for o in other.generate(PROMPTS, params) for c in o.outputs] == want
    greedy = SamplingParams(max_tokens=40, temperature=0.0, structured_outputs=SO(regex=r"[a-c]{3}-\d\d"))
    queued = Engine.from_pretrained(num_decode_steps=4)  # greedy rows with a grammar run one step at a time
    assert [o.outputs[0].text for o in queued.generate(PROMPTS, greedy)] == [
        o.outputs[0].text for o in engine.generate(PROMPTS, greedy)]


@pytest.mark.parametrize("so, field", [
    (dict(regex="(unclosed"), "regex"), (dict(json="{not json"), "json"), (dict(grammar="root ::= "), "grammar")])
def test_a_grammar_that_does_not_compile_is_refused_by_name(engine, so, field):
    with pytest.raises(ValueError, match=f"structured_outputs {field} does not compile"):
        engine.add_request("Hi", SamplingParams(structured_outputs=SO(**so)))
    assert not engine.has_unfinished_requests()


def test_params_take_exactly_one_kind_and_accept_a_dict():
    with pytest.raises(ValueError, match="exactly one of"):
        SO()
    with pytest.raises(ValueError, match="exactly one of"):
        SO(regex="a", choice=["b"])
    with pytest.raises(ValueError, match="non-empty list of strings"):
        SO(choice=[])
    assert SamplingParams(structured_outputs={"regex": "a+"}).structured_outputs == SO(regex="a+")
    assert choice_grammar(['a"b', "c\\d"]) == 'root ::= "a\\"b" | "c\\\\d"'


def test_a_grammar_that_allows_everything_changes_nothing(engine):
    free = SamplingParams(max_tokens=24, temperature=0.0)
    anything = SamplingParams(max_tokens=24, temperature=0.0, structured_outputs=SO(grammar="root ::= [^]*"))
    assert [o.outputs[0].token_ids for o in engine.generate(PROMPTS, anything)] == [
        o.outputs[0].token_ids for o in engine.generate(PROMPTS, free)]


def test_reasoning_is_free_until_its_end_marker_then_the_answer_is_constrained(engine):
    """A stand-in for "</think>": two characters the unconstrained run writes early. With the same seed the
    constrained run writes the same free text up to the marker, and after it only what the grammar allows."""
    free = dict(max_tokens=40, temperature=0.7, seed=4)
    for prompt in PROMPTS:
        [unconstrained] = engine.generate([prompt], SamplingParams(**free))
        reasoning = unconstrained.outputs[0].text
        marker = reasoning[2:4]
        params = SamplingParams(**free, structured_outputs=SO(regex=r"\[[0-9]{3}\]", reasoning_end=marker))
        [out] = engine.generate([prompt], params)
        text = out.outputs[0].text
        head = reasoning[:reasoning.index(marker) + len(marker)]
        assert text.startswith(head) and re.fullmatch(r"\[[0-9]{3}\]", text[-5:]), (reasoning, text)
        assert len(text) - 5 < len(head) + 8  # the answer starts right after the marker's token


def test_json_object_is_an_object_not_any_json(engine):
    """Regression (s35's fuzzing): response_format json_object compiled xgrammar's builtin JSON grammar, which also
    takes arrays and scalars, and the demo model answered `[3000, 70, ...`; OpenAI's JSON mode answers an object."""
    manager = engine.structured_outputs
    for text, accepted in (('{"a": [1, 2]}', True), ("[1, 2]", False), ("3", False), ('"x"', False)):
        assert manager.matcher(manager.compile(SO(json_object=True))).accept_string(text) is accepted, text


@pytest.mark.parametrize("fields", [{"choice": "abc"}, {"json_object": "yes"}, {"regex": 5},
                                    {"json": 3}, {"json_object": True, "disable_any_whitespace": "x"}])
def test_structured_outputs_fields_of_the_wrong_type_are_refused(fields):
    """Regression (s35's fuzzing): structured_outputs {"choice": "abc"} constrained the output to a, b or c (a string
    iterates as its characters), and {"json_object": "yes"} passed as true."""
    with pytest.raises(ValueError, match="structured_outputs"):
        SO(**fields)


def test_the_compiled_grammars_cache_is_bounded(monkeypatch):
    """Distinct schemas past GRAMMAR_CACHE_BYTES drop the least recently used (s36's fuzzing: unbounded, 40,000-value
    enums grew the server ~73 MB each); a dropped grammar compiles again when asked for."""
    from graphllm.runtime import structured_output
    monkeypatch.setattr(structured_output, "GRAMMAR_CACHE_BYTES", 2**20)
    engine = Engine.from_pretrained()  # the demo model: its own manager, built after the patch
    manager = engine.structured_outputs
    schemas = [{"enum": [f"v{i}-{j}" for j in range(400)]} for i in range(48)]  # ~2.3 MB unbounded
    for schema in schemas:
        manager.compile(SO(json=schema))
    assert 0 < manager._grammar_compiler().get_cache_size_bytes() <= 2**20
    out = engine.generate([[1, 5, 9]], SamplingParams(temperature=0, max_tokens=40,
                                                      structured_outputs=SO(json=schemas[0])))[0].outputs[0]
    assert json.loads(out.text) in schemas[0]["enum"]


def test_a_checked_grammar_is_not_compiled_again_when_its_request_is_added(monkeypatch):
    """The server compiles a request's grammar in its grammar threads (check_structured_outputs), then adds the
    request on its event loop: add_request compiled it again there, for minutes with a large schema whenever
    xgrammar's bounded cache had dropped it in between (s36 left this alone). Now it takes the checked grammar."""
    from graphllm.runtime import structured_output
    engine = Engine.from_pretrained()
    compiles, real = [], structured_output._compile
    monkeypatch.setattr(structured_output, "_compile", lambda *a: compiles.append(1) or real(*a))
    so = SO(json={"enum": ["yes", "no"]})
    engine.check_structured_outputs(so)
    engine.structured_outputs._grammar_compiler().clear_cache()  # as if other grammars had pushed it out
    out = engine.generate([[1, 5, 9]], SamplingParams(temperature=0, max_tokens=8, structured_outputs=so))
    assert len(compiles) == 1 and json.loads(out[0].outputs[0].text) in ("yes", "no")
    engine.generate([[1, 5, 9]], SamplingParams(max_tokens=8, structured_outputs=so))  # not checked again: compiles
    assert len(compiles) == 2 and not engine.structured_outputs._checked
