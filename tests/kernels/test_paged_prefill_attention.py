"""Varlen paged prefill attention equals the float32 reference: prefill, chunked, mixed batches, over
a cache of q's dtype or a float8 one read with its scales, with and without Gemma 2's logit soft cap."""

import math

import pytest
import torch

pytest.importorskip("triton")

from graphllm.kernels.paged_prefill_attention import (  # noqa: E402
    DECODE_KERNEL_MIN_SEQS, LONG_PROMPT_TILE, PREFILL_TILE, paged_prefill_attention, paged_prefill_attention_reference,
    prefill_tile)
from graphllm.kernels.kv_quant import FP8_KV_DTYPE, KVScales  # noqa: E402
from tests.kernels.conftest import (  # noqa: E402
    LOW_DTYPE, assert_close, gpu_only, make_paged_kv, randn)

FP8_SCALES = KVScales(k=0.37, v=1.9)  # not 1.0: a dropped or swapped scale shows
SOFTCAP = 0.7  # below most |scaled scores| here (randn q, k): a dropped or misplaced cap shows

# (Hq, Hkv, D, block_size, [(cached, new) per sequence], sliding_window)
SMALL = [
    (4, 4, 64, 16, [(0, 1), (0, 16), (0, 37)], 0),  # plain prefill: 1 token, a block, partial
    (8, 2, 128, 16, [(37, 20)], 0),  # chunked prefill over a cached prefix
    (16, 2, 64, 8, [(0, 40), (37, 20), (99, 1), (0, 1), (5, 0)], 0),  # mixed, decode, no tokens
    (8, 2, 64, 32, [(30, 50), (0, 70), (120, 1)], 24),  # sliding window
    (16, 2, 64, 8, [(0, 40), (99, 1), (0, 0), (0, 0)], 0),  # empty sequences after: a mixed graph's padding
    # keys over several 64-key tiles: rows_attention's unmasked tiles, then the diagonal (and a window's start)
    (4, 2, 32, 16, [(200, 20), (0, 150), (130, 1)], 0),
    (4, 2, 32, 16, [(200, 20), (0, 150), (130, 1)], 100),
]
LARGE = [
    (32, 8, 128, 16, [(0, 1000), (512, 300), (4000, 1), (0, 1), (2000, 64)], 0),
    (32, 8, 128, 16, [(0, 2000), (1500, 700), (3000, 1)], 1024),
    (28, 4, 128, 16, [(0, 333), (100, 77)], 0),  # group 7: not a power of two
    (16, 16, 64, 32, [(0, 129)] * 9 + [(50, 1)] * 30, 0),
]


def run_case(case, dtype, seed=0, index_dtype=torch.int64, cache_dtype=None, kv_scales=KVScales(),
             decode_kernel_min_seqs=DECODE_KERNEL_MIN_SEQS, logit_softcap=0.0, **tile):
    """cache_dtype None: q's dtype; decode_kernel_min_seqs 0: one-token rows in the decode kernel's launch;
    tile: the prefill kernel's block_m / block_n / num_warps / num_stages."""
    num_heads, num_kv_heads, head_dim, block_size, chunks, window = case
    seq_lens = [cached + new for cached, new in chunks]
    kv_cache, block_tables = make_paged_kv(seq_lens, block_size, num_kv_heads, head_dim,
                                           cache_dtype or dtype, seed)
    starts = torch.tensor([0] + [new for _, new in chunks]).cumsum(0)  # query_start_loc [B + 1]
    starts = starts.to(kv_cache.device, index_dtype)
    q = randn((int(starts[-1]), num_heads, head_dim), dtype, seed + 1)
    seq_lens_t = torch.tensor(seq_lens, device=q.device, dtype=index_dtype)
    block_tables = block_tables.to(index_dtype)
    args = (q, kv_cache[0], kv_cache[1], block_tables, seq_lens_t, starts,
            1 / math.sqrt(head_dim), window)
    got = paged_prefill_attention(*args, kv_scales=kv_scales, decode_kernel_min_seqs=decode_kernel_min_seqs,
                                  logit_softcap=logit_softcap, **tile)
    assert_close(got, paged_prefill_attention_reference(*args, kv_scales=kv_scales, logit_softcap=logit_softcap))


def min_seqs(decode_launch: bool) -> int:
    """decode_kernel_min_seqs that sends a step's one-token rows to the decode kernel's launch, or never."""
    return 0 if decode_launch else 1 << 30


@pytest.mark.parametrize("decode_launch", [False, True])
@pytest.mark.parametrize("case", SMALL)
def test_prefill_matches_reference_fp32(case, decode_launch):
    run_case(case, torch.float32, decode_kernel_min_seqs=min_seqs(decode_launch))


def test_long_prompts_take_the_long_tile_and_mixed_steps_the_default():
    """prefill_tile: one 8,192-token prompt and two of 2,048 take LONG_PROMPT_TILE (measured faster there on an
    H100); 8 x 1,024, a mixed step of 200 decodes beside a 900-token prompt, and wide heads do not."""
    assert prefill_tile(8192, 1, 128) == prefill_tile(4096, 2, 128) == LONG_PROMPT_TILE
    assert prefill_tile(8192, 8, 128) == prefill_tile(1100, 201, 128) == prefill_tile(900, 1, 128) == PREFILL_TILE
    assert prefill_tile(8192, 1, 256) == (PREFILL_TILE[0], 32, 8)


@pytest.mark.parametrize("tile", [dict(block_m=128, block_n=64), dict(block_m=128, block_n=128, num_warps=8),
                                  dict(block_m=64, block_n=128, num_stages=2)], ids=["128x64", "128x128", "64x128"])
@pytest.mark.parametrize("case", [SMALL[2], SMALL[3], SMALL[6]])  # mixed and decodes; a window; many key tiles
def test_prefill_tiles_the_sweep_tries_match_reference(case, tile):
    """The tiles kernel_sweep's prefill part times against PREFILL_TILE: more query rows a program (32 tokens of a
    GQA-4 group), wider key tiles."""
    run_case(case, torch.float32, **tile)


@pytest.mark.parametrize("decode_launch", [False, True])
@pytest.mark.parametrize("case", SMALL[2:4])  # mixed with one-token rows; sliding window
def test_prefill_soft_cap_matches_reference(case, decode_launch):
    run_case(case, torch.float32, decode_kernel_min_seqs=min_seqs(decode_launch), logit_softcap=SOFTCAP)


def test_prefill_soft_cap_half_queries():
    run_case(SMALL[1], LOW_DTYPE, logit_softcap=SOFTCAP)


@pytest.mark.parametrize("case", SMALL[1:3])
def test_prefill_matches_reference_half(case):
    run_case(case, LOW_DTYPE)


@pytest.mark.parametrize("decode_launch", [False, True])
@pytest.mark.parametrize("case", SMALL)
def test_prefill_fp8_cache_matches_reference(case, decode_launch):
    run_case(case, torch.float32, cache_dtype=FP8_KV_DTYPE, kv_scales=FP8_SCALES,
             decode_kernel_min_seqs=min_seqs(decode_launch))


@pytest.mark.parametrize("case", SMALL)
def test_prefill_fp8_cache_bfloat16_queries(case):
    """bf16 queries over a float8 cache: the dots run in float16 with q pre-scaled (rows_attention)."""
    run_case(case, torch.bfloat16, cache_dtype=FP8_KV_DTYPE, kv_scales=FP8_SCALES)


def test_prefill_fp8_cache_half_queries():
    run_case(SMALL[2], LOW_DTYPE, cache_dtype=FP8_KV_DTYPE, kv_scales=FP8_SCALES)


@pytest.mark.parametrize("decode_launch", [False, True])
def test_prefill_accepts_int32_metadata(decode_launch):
    run_case(SMALL[2], torch.float32, index_dtype=torch.int32, decode_kernel_min_seqs=min_seqs(decode_launch))


@gpu_only
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("case", LARGE)
def test_prefill_matches_reference_large(case, dtype):
    run_case(case, dtype)
    run_case(case, dtype, decode_kernel_min_seqs=0)


@gpu_only
@pytest.mark.parametrize("case", LARGE[:2])
def test_prefill_soft_cap_matches_reference_large(case):
    run_case(case, torch.bfloat16, logit_softcap=50.0 / 16)
    run_case(case, torch.bfloat16, decode_kernel_min_seqs=0, logit_softcap=50.0 / 16)


@gpu_only
@pytest.mark.parametrize("case", LARGE)
def test_prefill_fp8_cache_matches_reference_large(case):
    run_case(case, torch.bfloat16, cache_dtype=FP8_KV_DTYPE, kv_scales=FP8_SCALES)


@gpu_only
@pytest.mark.parametrize("cache", ["bf16", "fp8"])
@pytest.mark.parametrize("case", [(32, 8, 128, 16, [(0, 2100)], 0), (32, 8, 128, 16, [(300, 2100), (0, 2048)], 0),
                                  (32, 8, 128, 16, [(0, 2500)], 1024)], ids=["one", "chunk", "window"])
def test_long_prompts_long_tile_matches_reference(case, cache):
    """Steps of 2,048+ new tokens a sequence take LONG_PROMPT_TILE (prefill_tile): over bf16 and float8 caches, a
    cached prefix, and a sliding window."""
    assert prefill_tile(sum(new for _, new in case[4]), len(case[4]), case[2]) == LONG_PROMPT_TILE
    run_case(case, torch.bfloat16, **(dict(cache_dtype=FP8_KV_DTYPE, kv_scales=FP8_SCALES) if cache == "fp8" else {}))
