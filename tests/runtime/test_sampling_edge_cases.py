"""Edge cases of sampling and structured output found by s36's fuzzing, on the built-in demo model: a grammar
and min_tokens that disagree about where the output ends, a grammar that no token can start, sampling values
that do not survive the sampler's float32, and a repetition penalty so small that logits overflow."""

import pytest
import torch

from graphllm import Engine, SamplingParams
from graphllm.runtime.sampler import Sampler
from graphllm.runtime.structured_output import StructuredOutputsParams as SO
from tests.runtime.test_sampler import make_row

PROMPT = "Hello there"


@pytest.fixture(scope="module")
def engine():
    return Engine.from_pretrained()


def check_idle(engine):
    assert not engine.has_unfinished_requests() and engine.pool.num_free_blocks == engine.pool.num_blocks


@pytest.mark.parametrize("sampling", [{"temperature": 0.0}, {"temperature": 1.0, "seed": 3, "n": 2},
                                      {"temperature": 0.0, "logprobs": 1}])
def test_min_tokens_does_not_outlast_a_grammar_that_must_end(engine, sampling):
    """min_tokens forbade the end-of-text token where the grammar allowed nothing else: every logit -inf,
    token 0 sampled, the grammar refused it and the sequence ended with "abort"."""
    params = SamplingParams(max_tokens=12, min_tokens=8, structured_outputs=SO(choice=["yes", "no"]), **sampling)
    for out in engine.generate([PROMPT], params)[0].outputs:
        assert out.text in ("yes", "no") and out.finish_reason == "stop"
    check_idle(engine)


def test_min_tokens_still_lengthens_what_a_grammar_lets_continue(engine):
    params = SamplingParams(max_tokens=12, min_tokens=6, temperature=0.0, structured_outputs=SO(regex="[a-c]{1,9}"))
    out = engine.generate([PROMPT], params)[0].outputs[0]
    assert len(out.text) >= 6 and set(out.text) <= set("abc") and out.finish_reason in ("stop", "length")


@pytest.mark.parametrize("so", [SO(regex=r"[^\s\S]"), SO(grammar='root ::= [^\\x00-\\U0010FFFF]')])
def test_a_grammar_no_token_can_start_is_refused(engine, so):
    """It was accepted; its sequence sampled a token the grammar forbade and ended with "abort"."""
    with pytest.raises(ValueError, match="admits no output"):
        engine.add_request(PROMPT, SamplingParams(structured_outputs=so))
    check_idle(engine)
    assert engine.generate([PROMPT], SamplingParams(max_tokens=2))[0].outputs[0].finish_reason == "length"


def test_grammars_that_only_end_are_kept(engine):
    for so in (SO(regex=""), SO(choice=[""]), SO(grammar='root ::= ""')):
        out = engine.generate([PROMPT], SamplingParams(max_tokens=4, structured_outputs=so))[0].outputs[0]
        assert out.text == "" and out.finish_reason == "stop"


@pytest.mark.parametrize("field, value", [("top_p", 1e-46), ("repetition_penalty", 1e-50), ("temperature", 1e39)])
def test_values_the_sampler_cannot_hold_in_float32_are_refused(field, value):
    """top_p 1e-46 is 0 in float32: the nucleus lost every token and each step sampled token 0."""
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_a_repetition_penalty_near_zero_samples_among_the_seen_tokens():
    """1e-38 divides a positive logit past float32's range: +inf made the softmax NaN and token 0 came out."""
    logits = torch.full((1, 16), -1.0)
    logits[0, 5], logits[0, 9] = 2.0, 3.0  # the seen tokens with positive logits: both become +inf
    params = SamplingParams(temperature=0.5, repetition_penalty=1e-38)
    for seed in range(20):
        out = Sampler()(logits, [make_row(params, prompt=[5, 9, 12], seed=seed)])
        assert out.token_ids[0] in (5, 9)


def test_min_tokens_leaves_a_row_its_stop_token_when_nothing_else_is_allowed():
    logits = torch.full((2, 8), float("-inf"))
    logits[:, 2] = 0.0  # a grammar that can only end: the stop token is its one allowed token
    logits[1, 4] = -1.0  # a grammar that may also go on
    rows = [make_row(SamplingParams(temperature=0.0, min_tokens=3), stop_ids=[2])] * 2
    assert Sampler()(logits, rows).token_ids == [2, 4]
