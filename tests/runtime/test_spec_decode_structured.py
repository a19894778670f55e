"""Structured output under speculative decoding, on the built-in demo model (its byte-level vocabulary can
spell any grammar): each verify row is masked by the grammar as it stands after the proposals before it, so
greedy outputs equal a plain engine's token for token, proposals the grammar forbids are rejected, and sampled
outputs obey their grammar."""

import json
import re

import pytest

from graphllm import Engine, SamplingParams
from graphllm.demo import DEMO_MODEL_DIR
from graphllm.runtime.structured_output import StructuredOutputsParams as SO

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["ok", "n", "color"],
          "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 99},
                         "color": {"enum": ["red", "green", "blue"]}}}
PROMPTS = ["Hello there", "What is 2 plus 2?", "What is 17 plus 25? 17 plus 25 is"]
GRAMMARS = [SO(json=SCHEMA, disable_any_whitespace=True), SO(regex=r"[a-c]{3}-\d\d"),
            SO(choice=["yes", "no", 'say "maybe"']), SO(grammar='root ::= "x" [0-9] [0-9]? "y"')]
SPECS = [{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1},
         {"model": str(DEMO_MODEL_DIR), "num_speculative_tokens": 4}]  # the target as its own (free) draft


@pytest.fixture(scope="module")
def plain():
    return Engine.from_pretrained(async_scheduling=False)


@pytest.fixture(scope="module", params=SPECS, ids=["ngram", "draft-self"])
def spec(request):
    return Engine.from_pretrained(speculative_config=request.param)


def outputs(engine: Engine, params: SamplingParams) -> list[tuple[list[int], str, str]]:
    outs = engine.generate(PROMPTS, params)
    assert not engine.has_unfinished_requests()
    assert engine.pool.num_free_blocks == engine.pool.num_blocks and sum(engine.pool.ref_counts) == 0
    return [(list(c.token_ids), c.text, c.finish_reason) for o in outs for c in o.outputs]


@pytest.mark.parametrize("so", GRAMMARS, ids=["json", "regex", "choice", "grammar"])
def test_greedy_outputs_equal_plain_decoding(plain, spec, so):
    params = SamplingParams(temperature=0, max_tokens=40, structured_outputs=so)
    assert outputs(spec, params) == outputs(plain, params)


def test_the_grammar_rejects_proposals(plain, spec):
    """The free draft proposes what the unconstrained model writes: under a grammar most of it is refused,
    yet what comes out equals plain decoding (and the proposals were verified: some accepted, some not)."""
    before = spec.stats().spec_decode
    params = SamplingParams(temperature=0, max_tokens=40, structured_outputs=GRAMMARS[0])
    assert outputs(spec, params) == outputs(plain, params)
    after = spec.stats().spec_decode
    drafted = after.num_draft_tokens - before.num_draft_tokens
    accepted = after.num_accepted_tokens - before.num_accepted_tokens
    assert drafted > 0 and 0 < accepted < drafted


def test_greedy_logprobs_are_of_the_constrained_logits(plain, spec):
    params = SamplingParams(temperature=0, max_tokens=24, logprobs=3, structured_outputs=GRAMMARS[1])
    got, want = spec.generate(PROMPTS, params), plain.generate(PROMPTS, params)
    for out, ref in zip(got, want):
        assert out.outputs[0].token_ids == ref.outputs[0].token_ids
        for entry, ref_entry in zip(out.outputs[0].logprobs, ref.outputs[0].logprobs):
            assert entry.keys() == ref_entry.keys()
            for token, lp in entry.items():
                assert lp.logprob == pytest.approx(ref_entry[token].logprob, abs=1e-4)


def test_sampled_outputs_obey_the_grammar(spec):
    params = SamplingParams(temperature=1.0, seed=5, n=3, max_tokens=48, structured_outputs=GRAMMARS[0])
    for _, text, reason in outputs(spec, params):
        value = json.loads(text)
        assert reason == "stop" and set(value) == {"ok", "n", "color"} and value["color"] in ("red", "green", "blue")
    params = SamplingParams(temperature=0.8, seed=9, n=3, max_tokens=16, structured_outputs=GRAMMARS[1])
    for _, text, reason in outputs(spec, params):
        assert re.fullmatch(r"[a-c]{3}-\d\d", text) and reason == "stop"


def test_a_grammar_that_opens_inside_an_accepted_run(plain, spec):
    """A reasoning model's grammar waits for reasoning_end; the demo model writes '"::::' freely, so the
    grammar opens inside a verify step's run, whose later tokens were not masked: they are dropped and
    decoded again under the grammar, as plain decoding does."""
    params = SamplingParams(temperature=0, max_tokens=30,
                            structured_outputs=SO(regex=r"[a-c]{3}-\d\d", reasoning_end="::"))
    got = outputs(spec, params)
    assert got == outputs(plain, params)
    text = got[0][1]
    assert "::" in text and re.fullmatch(r"[a-c]{3}-\d\d", text[text.index("::") + 2:])
