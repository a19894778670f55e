"""Sampler: penalties, masking, seeded sampling, distributions and logprobs."""

import math

import pytest
import torch
from scipy.stats import chisquare
from torch.overrides import TorchFunctionMode

from graphllm.runtime.sampler import (
    Sampler,
    SamplingRow,
    apply_min_p,
    apply_penalties,
    apply_top_k_top_p,
)
from graphllm.runtime.sampling_params import SamplingParams


def make_row(params=None, prompt=(), output=(), seed=None, stop_ids=()):
    gen = None if seed is None else torch.Generator().manual_seed(seed)
    return SamplingRow(params or SamplingParams(), list(prompt), list(output), gen, list(stop_ids))


def draw(logits_row, params, n, seed=0):
    """n i.i.d. draws from one logits vector: a [n, V] batch after torch.manual_seed."""
    torch.manual_seed(seed)
    logits = logits_row.expand(n, -1).contiguous()
    return torch.tensor(Sampler()(logits, [make_row(params)] * n).token_ids)


def histogram(tokens, vocab):
    return torch.bincount(tokens, minlength=vocab).double()


# ---------------------------------------------------------------- greedy / top-k=1


def test_temperature_zero_is_argmax():
    logits = torch.randn(32, 500, generator=torch.Generator().manual_seed(1))
    out = Sampler()(logits, [make_row(SamplingParams(temperature=0.0))] * 32)
    assert out.token_ids == logits.argmax(dim=-1).tolist()


@pytest.mark.parametrize("temperature", [0.5, 1.0, 5.0])
def test_top_k_one_equals_greedy(temperature):
    logits = torch.randn(64, 1000, generator=torch.Generator().manual_seed(2))
    params = SamplingParams(temperature=temperature, top_k=1)
    out = Sampler()(logits, [make_row(params)] * 64)
    assert out.token_ids == logits.argmax(dim=-1).tolist()


def test_top_k_one_breaks_ties_like_argmax():
    logits = torch.zeros(4, 10)
    logits[:, [3, 7]] = 5.0  # tie between ids 3 and 7; argmax picks 3
    for seed in range(20):
        torch.manual_seed(seed)
        out = Sampler()(logits, [make_row(SamplingParams(top_k=1))] * 4)
        assert out.token_ids == [3, 3, 3, 3]


def test_greedy_and_sampled_rows_mix():
    logits = torch.randn(6, 300, generator=torch.Generator().manual_seed(3))
    rows = [make_row(SamplingParams(temperature=t)) for t in (0.0, 1.0, 0.0, 1.0, 0.0, 1.0)]
    out = Sampler()(logits, rows)
    argmax = logits.argmax(dim=-1).tolist()
    assert [out.token_ids[i] for i in (0, 2, 4)] == [argmax[i] for i in (0, 2, 4)]


@pytest.mark.parametrize("params", [
    SamplingParams(repetition_penalty=1.5, presence_penalty=1.0, top_p=0.5, min_p=0.1),
    SamplingParams(top_k=5, top_p=0.5, min_p=0.1, logprobs=3),  # no copy: nothing writes to it
    SamplingParams(temperature=0.0, min_tokens=4),
])
def test_input_logits_are_not_modified(params):
    logits = torch.randn(3, 50)
    before = logits.clone()
    Sampler()(logits, [make_row(params, prompt=[1, 2], output=[3, 4], stop_ids=[5, 6])] * 3)
    assert torch.equal(logits, before)


class TensorOps(TorchFunctionMode):
    """Records the name of every torch function and Tensor method called under it."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_plain_greedy_batch_is_one_argmax(dtype):
    """Regression: an all-greedy batch copied its [B, V] logits to float32 and made four passes."""
    logits = torch.randn(16, 300, generator=torch.Generator().manual_seed(4)).to(dtype)
    rows = [make_row(SamplingParams(temperature=0.0, min_tokens=3), output=[1, 2, 3], stop_ids=[2])] * 16
    with TensorOps() as ops:
        out = Sampler()(logits, rows)
    assert out.token_ids == logits.float().argmax(dim=-1).tolist() and out.logprobs == [None] * 16
    assert sorted(set(ops.names) - {"dim", "__get__"}) == ["argmax", "tolist"]
    assert ops.names.count("argmax") == 1


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_low_precision_logits_are_accepted(dtype):
    logits = torch.randn(4, 100).to(dtype)
    out = Sampler()(logits, [make_row(SamplingParams(temperature=0.0, logprobs=2))] * 4)
    assert out.token_ids == logits.float().argmax(dim=-1).tolist()


# ---------------------------------------------------------------- seeds


def run_steps(logits_steps, rows_of_step):
    """Sample each step; row 0 is the request under test. Returns its tokens."""
    sampler = Sampler()
    return [sampler(logits, rows_of_step(i)).token_ids[0] for i, logits in enumerate(logits_steps)]


def test_same_seed_same_tokens_regardless_of_batch_neighbours():
    gen = torch.Generator().manual_seed(4)
    steps = [torch.randn(5, 64, generator=gen) for _ in range(30)]
    params = SamplingParams(temperature=1.5, seed=123)

    seeded = make_row(params, seed=123)
    torch.manual_seed(0)
    alone = run_steps([s[:1] for s in steps], lambda _: [seeded])

    seeded = make_row(params, seed=123)
    neighbours = [
        make_row(SamplingParams(temperature=0.8)),
        make_row(SamplingParams(temperature=0.0)),
        make_row(SamplingParams(seed=9), seed=9),
        make_row(SamplingParams(top_p=0.5, top_k=10)),
    ]
    torch.manual_seed(1)  # the global RNG must not matter for a seeded row
    crowded = run_steps(steps, lambda _: [seeded] + neighbours)

    assert alone == crowded
    assert len(set(alone)) > 5  # really sampled, not a constant


def test_different_seeds_give_different_tokens():
    gen = torch.Generator().manual_seed(5)
    steps = [torch.randn(1, 64, generator=gen) for _ in range(30)]
    params = SamplingParams(temperature=1.5)
    a = run_steps(steps, lambda _, r=make_row(params, seed=1): [r])
    b = run_steps(steps, lambda _, r=make_row(params, seed=2): [r])
    assert a != b


# ---------------------------------------------------------------- distributions


LOGITS8 = torch.tensor([1.0, 0.5, 0.0, -0.5, 2.0, -1.0, 0.3, 1.2])
N_DRAWS = 20000


def test_temperature_sampling_matches_softmax():
    tokens = draw(LOGITS8, SamplingParams(temperature=0.7), N_DRAWS)
    observed = histogram(tokens, 8)
    expected = torch.softmax(LOGITS8.double() / 0.7, dim=0) * N_DRAWS
    assert chisquare(observed, expected).pvalue > 1e-3
    # The test has power: the untempered distribution is clearly rejected.
    wrong = torch.softmax(LOGITS8.double(), dim=0) * N_DRAWS
    assert chisquare(observed, wrong).pvalue < 1e-6


def test_seeded_batch_matches_softmax():
    logits = LOGITS8.expand(4000, -1).contiguous()
    rows = [make_row(SamplingParams(temperature=0.7, seed=s), seed=s) for s in range(4000)]
    observed = histogram(torch.tensor(Sampler()(logits, rows).token_ids), 8)
    expected = torch.softmax(LOGITS8.double() / 0.7, dim=0) * 4000
    assert chisquare(observed, expected).pvalue > 1e-3


def test_top_k_restricts_support_and_renormalizes():
    tokens = draw(LOGITS8, SamplingParams(top_k=3), N_DRAWS)
    top3 = [4, 7, 0]
    assert set(tokens.tolist()) == set(top3)
    observed = histogram(tokens, 8)[top3]
    expected = torch.softmax(LOGITS8.double()[top3], dim=0) * N_DRAWS
    assert chisquare(observed, expected).pvalue > 1e-3


PROBS5 = torch.tensor([0.4, 0.3, 0.15, 0.1, 0.05])


@pytest.mark.parametrize(
    "top_p, support", [(0.35, {0}), (0.6, {0, 1}), (0.75, {0, 1, 2}), (1.0, {0, 1, 2, 3, 4})]
)
def test_top_p_restricts_support(top_p, support):
    tokens = draw(PROBS5.log(), SamplingParams(top_p=top_p), 5000)
    assert set(tokens.tolist()) == support


def test_top_p_applies_after_top_k():
    # After top-k=2 the renormalized probs are [0.57, 0.43]: top-p 0.5 keeps only id 0.
    tokens = draw(PROBS5.log(), SamplingParams(top_k=2, top_p=0.5), 2000)
    assert set(tokens.tolist()) == {0}


@pytest.mark.parametrize(
    "min_p, support", [(0.25, {0, 1, 2}), (0.35, {0, 1}), (0.0, {0, 1, 2, 3, 4})]
)
def test_min_p_removes_tokens_below_threshold(min_p, support):
    probs = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05])  # threshold = min_p * 0.5
    tokens = draw(probs.log(), SamplingParams(min_p=min_p), 5000)
    assert set(tokens.tolist()) == support


def test_masks_are_per_row():
    logits = PROBS5.log().expand(3, -1).contiguous()
    k = torch.tensor([[1], [5], [5]])
    p = torch.tensor([[1.0], [0.6], [1.0]])
    masked = apply_top_k_top_p(logits, k, p)
    assert torch.isfinite(masked).tolist() == [
        [True, False, False, False, False],
        [True, True, False, False, False],
        [True, True, True, True, True],
    ]
    assert torch.equal(masked[2], logits[2])
    min_p = torch.tensor([[0.0], [0.5], [0.9]])  # thresholds 0, 0.2, 0.36
    assert torch.isfinite(apply_min_p(logits, min_p)).sum(dim=1).tolist() == [5, 2, 1]


# ---------------------------------------------------------------- penalties


BASE = [2.0, -1.0, 0.5, -0.5, 1.0, 0.0]


def test_repetition_penalty_over_prompt_and_output():
    row = make_row(SamplingParams(repetition_penalty=2.0), prompt=[0, 1], output=[2, 2, 3])
    out = apply_penalties(torch.tensor([BASE]), [row])
    assert out[0].tolist() == [1.0, -2.0, 0.25, -1.0, 1.0, 0.0]


def test_presence_and_frequency_penalties_over_output_only():
    params = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25)
    row = make_row(params, prompt=[0, 1], output=[2, 2, 3])
    out = apply_penalties(torch.tensor([BASE]), [row])
    # id 2: count 2 -> -(0.5 + 0.5); id 3: count 1 -> -(0.5 + 0.25); prompt ids untouched.
    assert out[0].tolist() == [2.0, -1.0, -0.5, -1.25, 1.0, 0.0]


def test_negative_penalties_encourage():
    params = SamplingParams(presence_penalty=-1.0, frequency_penalty=-0.5)
    out = apply_penalties(torch.tensor([BASE]), [make_row(params, output=[4, 4])])
    assert out[0].tolist() == [2.0, -1.0, 0.5, -0.5, 3.0, 0.0]


def test_all_penalties_combined_per_row():
    rows = [
        make_row(SamplingParams(), prompt=[0], output=[2]),  # no penalty: untouched
        make_row(
            SamplingParams(repetition_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25),
            prompt=[0, 1], output=[2, 2, 3],
        ),
        make_row(SamplingParams(frequency_penalty=1.0), prompt=[5], output=[5, 5, 5, 1]),
    ]
    out = apply_penalties(torch.tensor([BASE] * 3), rows)
    assert out.tolist() == [
        BASE,
        [1.0, -2.0, 0.25 - 1.0, -1.0 - 0.75, 1.0, 0.0],
        [2.0, -2.0, 0.5, -0.5, 1.0, -3.0],
    ]


def test_penalties_steer_greedy_choice():
    logits = torch.tensor([[3.0, 2.9, 0.0]])
    params = SamplingParams(temperature=0.0, presence_penalty=0.5)
    assert Sampler()(logits, [make_row(params, output=[0])]).token_ids == [1]
    assert Sampler()(logits, [make_row(params, output=[1])]).token_ids == [0]


# ---------------------------------------------------------------- min_tokens


def test_min_tokens_forbids_stop_ids_until_reached():
    logits = torch.tensor([[0.0, 5.0, 4.0, 1.0]])  # id 1 is the "eos"
    params = SamplingParams(temperature=0.0, min_tokens=3)
    short = make_row(params, output=[2, 2], stop_ids=[1])
    long_enough = make_row(params, output=[2, 2, 2], stop_ids=[1])
    out = Sampler()(logits.expand(2, -1), [short, long_enough])
    assert out.token_ids == [2, 1]


def test_min_tokens_holds_when_sampling():
    logits = torch.tensor([3.0, 3.0, 0.0, 0.0]).expand(2000, -1).contiguous()
    row = make_row(SamplingParams(min_tokens=1), stop_ids=[0, 1])
    torch.manual_seed(0)
    tokens = set(Sampler()(logits, [row] * 2000).token_ids)
    assert tokens == {2, 3}


# ---------------------------------------------------------------- logprobs


def expected_rank(raw_lp, token):
    return int((raw_lp > raw_lp[token]).sum()) + 1


def test_logprobs_come_from_raw_logits_with_ranks():
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(6))
    params = SamplingParams(
        temperature=0.9, repetition_penalty=1.7, presence_penalty=1.0, logprobs=5
    )
    rows = [make_row(params, prompt=[0, 1, 2], output=[3, 4]) for _ in range(3)]
    out = Sampler()(logits, rows)
    raw = torch.log_softmax(logits, dim=-1)
    for i, entry in enumerate(out.logprobs):
        token = out.token_ids[i]
        assert list(entry)[0] == token  # sampled token first
        assert entry[token].logprob == pytest.approx(raw[i, token].item(), abs=1e-6)
        assert entry[token].rank == expected_rank(raw[i], token)
        top = raw[i].argsort(descending=True)[:5].tolist()
        assert set(entry) == set(top) | {token}
        for rank, tok in enumerate(top, start=1):
            assert entry[tok].rank == rank
            assert entry[tok].logprob == pytest.approx(raw[i, tok].item(), abs=1e-6)
            assert entry[tok].decoded_token is None
        top_lps = [entry[t].logprob for t in top]
        assert top_lps == sorted(top_lps, reverse=True)


def test_logprobs_zero_returns_only_sampled_token():
    logits = torch.tensor([[0.0, 1.0, 3.0, 2.0]])
    params = SamplingParams(temperature=0.0, min_tokens=2, logprobs=0)
    out = Sampler()(logits, [make_row(params, stop_ids=[2])])
    # min_tokens moved the choice to id 3, but its logprob and rank stay raw.
    assert out.token_ids == [3]
    (token, lp), = out.logprobs[0].items()
    assert token == 3 and lp.rank == 2
    assert lp.logprob == pytest.approx(torch.log_softmax(logits[0], 0)[3].item(), abs=1e-6)


def test_logprobs_none_per_row_and_n_larger_than_vocab():
    logits = torch.randn(2, 6)
    rows = [make_row(SamplingParams()), make_row(SamplingParams(logprobs=20))]
    out = Sampler()(logits, rows)
    assert out.logprobs[0] is None
    assert len(out.logprobs[1]) == 6
    assert sorted(lp.rank for lp in out.logprobs[1].values()) == [1, 2, 3, 4, 5, 6]
    total = sum(math.exp(lp.logprob) for lp in out.logprobs[1].values())
    assert total == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize("chunk", [64, 256])
def test_two_stage_argmax_is_argmax_ties_included(chunk):
    """The CUDA greedy path's two reductions pick the same index as argmax: the first maximum,
    also when the maximum repeats within a chunk and across chunks."""
    from graphllm.runtime.sampler import argmax_rows, two_stage_argmax
    gen = torch.Generator().manual_seed(0)
    logits = torch.randint(-50, 50, (7, 4 * chunk), generator=gen).to(torch.bfloat16)  # many ties
    logits[1, 5] = logits[1, chunk + 9] = logits[1, 3 * chunk] = 100  # ties across chunks
    logits[2, chunk + 3] = logits[2, chunk + 7] = 100  # ties within a chunk
    logits[3] = -1e4  # a flat row
    expected = logits.argmax(dim=-1)
    assert torch.equal(two_stage_argmax(logits, chunk), expected)
    assert expected[1] == 5 and expected[2] == chunk + 3 and expected[3] == 0
    assert torch.equal(argmax_rows(logits), expected)  # CPU: plain argmax


# ---------------------------------------------------------------- logit_bias


def test_logit_bias_forces_bans_and_shifts_tokens_per_row():
    """OpenAI's logit_bias: +100 forces a token, -100 bans the argmax; a row without one is untouched; the
    sampled distribution is softmax(logits + bias); logprobs stay the raw model's."""
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 50, generator=gen)
    before = logits.clone()
    top = logits.argmax(dim=-1).tolist()
    rows = [make_row(SamplingParams(temperature=0.0, logit_bias={7: 100.0})),
            make_row(SamplingParams(temperature=0.0, logit_bias={top[1]: -100.0}, logprobs=1)),
            make_row(SamplingParams(temperature=0.0))]
    out = Sampler()(logits, rows)
    assert out.token_ids[0] == 7 and out.token_ids[2] == top[2]
    assert out.token_ids[1] == logits[1].clone().index_fill_(0, torch.tensor([top[1]]), -1e9).argmax().item()
    raw = torch.log_softmax(before[1], dim=-1)
    assert out.logprobs[1][out.token_ids[1]].logprob == pytest.approx(raw[out.token_ids[1]].item(), abs=1e-5)
    assert torch.equal(logits, before)  # the caller's logits are not written
    row = torch.zeros(4)
    tokens = draw(row, SamplingParams(temperature=1.0, logit_bias={3: math.log(3.0)}), 20000)
    freq = histogram(tokens, 4) / 20000  # softmax([0, 0, 0, log 3]) = [1/6, 1/6, 1/6, 1/2]
    assert freq.tolist() == pytest.approx([1 / 6, 1 / 6, 1 / 6, 1 / 2], abs=0.02)


@pytest.mark.parametrize("bias, message", [({-1: 1.0}, "keys must be token ids"), ({"5": 1.0}, "keys must be token ids"),
                                           ({5: float("nan")}, "finite"), ({5: "x"}, "finite"), ([5], "must map")])
def test_logit_bias_is_checked(bias, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(logit_bias=bias)
    assert SamplingParams(logit_bias={5: 250.0, 6: -1e9}).logit_bias == {5: 100.0, 6: -100.0}  # vLLM's clamp
