"""The verify-step attention kernel (a few new tokens per sequence, split over the keys) equals the float32
prefill reference: uneven token counts, long contexts split many ways, sliding windows, Gemma's soft cap, a
float8 cache, and the group not a power of two."""

import math

import pytest
import torch

pytest.importorskip("triton")

from graphllm.kernels.kv_quant import FP8_KV_DTYPE, KVScales  # noqa: E402
from graphllm.kernels.paged_prefill_attention import paged_prefill_attention_reference  # noqa: E402
from graphllm.kernels.paged_verify_attention import MAX_TOKENS, paged_verify_attention  # noqa: E402
from tests.kernels.conftest import LOW_DTYPE, assert_close, gpu_only, make_paged_kv, randn  # noqa: E402

# (Hq, Hkv, D, block_size, [(cached, new) per sequence], sliding_window)
CASES = [
    (8, 2, 64, 16, [(20, 5), (3, 1), (40, 3)], 0),  # verify rows of 1..k + 1 tokens
    (4, 4, 64, 16, [(0, 5), (130, 5)], 0),  # a sequence of new tokens only; every row of one length
    (8, 2, 128, 8, [(300, 4), (17, 2)], 0),  # long enough for several splits
    (8, 2, 64, 16, [(60, 5), (10, 3)], 24),  # a window that moves from row to row
    (8, 2, 64, 16, [(300, 4), (150, 2)], 100),  # a window's start, unmasked tiles, then the diagonal
    (28, 4, 64, 16, [(33, 3)], 0),  # group 7
]


def run_case(case, dtype, num_splits=None, cache_dtype=None, kv_scales=KVScales(), logit_softcap=0.0, seed=0):
    num_heads, num_kv_heads, head_dim, block_size, chunks, window = case
    seq_lens = [cached + new for cached, new in chunks]
    kv_cache, block_tables = make_paged_kv(seq_lens, block_size, num_kv_heads, head_dim, cache_dtype or dtype, seed)
    starts = torch.tensor([0] + [new for _, new in chunks]).cumsum(0).to(kv_cache.device)
    q = randn((int(starts[-1]), num_heads, head_dim), dtype, seed + 1)
    lens = torch.tensor(seq_lens, device=q.device)
    args = (q, kv_cache[0], kv_cache[1], block_tables, lens, starts, 1 / math.sqrt(head_dim), window)
    got = paged_verify_attention(*args, max(new for _, new in chunks), num_splits=num_splits, kv_scales=kv_scales,
                                 logit_softcap=logit_softcap)
    assert_close(got, paged_prefill_attention_reference(*args, kv_scales=kv_scales, logit_softcap=logit_softcap))


@pytest.mark.parametrize("num_splits", [None, 1, 3])
@pytest.mark.parametrize("case", CASES)
def test_matches_the_reference_fp32(case, num_splits):
    run_case(case, torch.float32, num_splits)


@pytest.mark.parametrize("case", CASES[::2])
def test_matches_the_reference_half(case):
    run_case(case, LOW_DTYPE, num_splits=2)


def test_soft_cap_and_float8_cache():
    run_case(CASES[3], torch.float32, num_splits=2, logit_softcap=0.7)
    run_case(CASES[0], LOW_DTYPE, num_splits=2, cache_dtype=FP8_KV_DTYPE, kv_scales=KVScales(k=0.37, v=1.9))


def test_the_most_tokens_a_sequence():
    run_case((8, 2, 64, 16, [(50, MAX_TOKENS), (5, 1)], 0), torch.float32, num_splits=2)
    with pytest.raises(AssertionError):
        run_case((8, 2, 64, 16, [(50, MAX_TOKENS + 1)], 0), torch.float32)


@gpu_only
def test_llama_8b_shape_long_context():
    run_case((32, 8, 128, 16, [(4000, 5), (1000, 2), (7000, 9)], 0), torch.bfloat16)
