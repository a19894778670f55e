"""Split-KV paged decode attention equals the float32 reference, for any number of splits, over a
cache of q's dtype or a float8 one read with its scales, with and without Gemma 2's logit soft cap."""

import math

import pytest
import torch

pytest.importorskip("triton")

import graphllm.kernels.paged_decode_attention as decode_module  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from graphllm.kernels.attention_loop import quantize_query_heads  # noqa: E402
from graphllm.kernels.paged_decode_attention import (  # noqa: E402
    decode_num_splits, default_num_splits, paged_decode_attention, paged_decode_attention_reference,
    quantize_query_heads_reference)
from graphllm.kernels.kv_quant import FP8_KV_DTYPE, KVScales  # noqa: E402
from tests.kernels.conftest import (  # noqa: E402
    DEVICE, LOW_DTYPE, ON_GPU, assert_close, gpu_only, make_paged_kv, randn, record_split_launches)

FP8_SCALES = KVScales(k=0.37, v=1.9)  # not 1.0: a dropped or swapped scale shows
SOFTCAP = 0.7  # below most |scaled scores| here (randn q, k): a dropped or misplaced cap shows

# (Hq, Hkv, D, block_size, seq_lens, sliding_window)
SMALL = [
    (4, 4, 64, 16, [1, 16, 37], 0),  # one token, one full block, a partial block
    (8, 2, 128, 16, [300, 5], 0),  # long: several tiles per split
    (16, 2, 64, 8, [48, 130], 0),  # group 8, small pages
    (8, 2, 64, 32, [200, 3, 64], 50),  # sliding window longer and shorter than the sequence
    (4, 4, 64, 16, [0, 33], 0),  # seq_len 0: a padded batch entry, zeros
]
LARGE = [
    (32, 8, 128, 16, [1, 17, 1000, 4096, 333], 0),
    (32, 8, 128, 16, [4096, 70, 2048], 1024),
    (64, 8, 64, 32, [513] * 40, 0),
    (28, 4, 128, 16, [777, 9], 0),  # group 7: not a power of two
]


FP8_MMA_TOLERANCE = 2e-3


def run_case(case, dtype, num_splits, seed=0, index_dtype=torch.int64, cache_dtype=None, kv_scales=KVScales(),
             logit_softcap=0.0, fp8_qk=None, rounds_q=None, **knobs):
    """cache_dtype None: q's dtype; knobs: paged_decode_attention's tuning keywords; fp8_qk: the kernel's, and the
    reference's unless rounds_q says what the kernel's default does (None: q is not rounded)."""
    rounds_q = bool(fp8_qk) if rounds_q is None else rounds_q
    num_heads, num_kv_heads, head_dim, block_size, seq_lens, window = case
    kv_cache, block_tables = make_paged_kv(seq_lens, block_size, num_kv_heads, head_dim,
                                           cache_dtype or dtype, seed)
    q = randn((len(seq_lens), num_heads, head_dim), dtype, seed + 1)
    seq_lens_t = torch.tensor(seq_lens, device=q.device, dtype=index_dtype)
    block_tables = block_tables.to(index_dtype)
    args = (q, kv_cache[0], kv_cache[1], block_tables, seq_lens_t, 1 / math.sqrt(head_dim), window)
    got = paged_decode_attention(*args, num_splits=num_splits, kv_scales=kv_scales, logit_softcap=logit_softcap,
                                 fp8_qk=fp8_qk, **knobs)
    expected = paged_decode_attention_reference(*args, kv_scales=kv_scales, logit_softcap=logit_softcap,
                                                fp8_qk=rounds_q)
    if rounds_q and ON_GPU and dtype == torch.float32:
        # sm_90's float8 wgmma adds its products into a narrower accumulator than float32's (DeepSeek-V3's
        # report: ~14 bits): over 128-wide heads the scores then differ from the float32 reference's by ~1e-4
        # relative, above float32's 1e-4 tolerance (2026-12-02 H200: head_dim 128 failed, 64 passed)
        torch.testing.assert_close(got, expected, atol=FP8_MMA_TOLERANCE, rtol=FP8_MMA_TOLERANCE)
    else:
        assert_close(got, expected)


@pytest.mark.parametrize("num_splits", [1, 3, None])
@pytest.mark.parametrize("case", SMALL)
def test_decode_matches_reference_fp32(case, num_splits):
    run_case(case, torch.float32, num_splits)


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("case", SMALL)
def test_decode_over_head_halves_matches_reference(case, num_splits):
    """head_halves: each tile's dots over the two halves of the head's dims (one_token_attention's HALVES), over
    every shape (a window, padding rows, group 8, 128-wide heads) and a float8 cache."""
    run_case(case, torch.float32, num_splits, head_halves=True)
    run_case(case, torch.float32, num_splits, cache_dtype=FP8_KV_DTYPE, kv_scales=FP8_SCALES, head_halves=True)


def test_decode_over_head_halves_half_queries_soft_cap():
    run_case(SMALL[2], LOW_DTYPE, 2, cache_dtype=FP8_KV_DTYPE, kv_scales=FP8_SCALES, head_halves=True)
    run_case(SMALL[3], LOW_DTYPE, 1, logit_softcap=SOFTCAP, head_halves=True)


@pytest.mark.parametrize("case", SMALL)
def test_decode_fp8_cache_bfloat16_queries(case):
    """bf16 queries over a float8 cache: the dots run in float16 with q pre-scaled (rows_attention)."""
    run_case(case, torch.bfloat16, num_splits=2, cache_dtype=FP8_KV_DTYPE, kv_scales=FP8_SCALES)


@pytest.mark.parametrize("case", SMALL[1:4])
def test_decode_matches_reference_half(case):
    run_case(case, LOW_DTYPE, num_splits=2)


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("case", [SMALL[0], SMALL[1], SMALL[3]])
def test_decode_fp8_cache_matches_reference(case, num_splits):
    run_case(case, torch.float32, num_splits, cache_dtype=FP8_KV_DTYPE, kv_scales=FP8_SCALES)


@pytest.mark.parametrize("case", SMALL[2:4])
def test_decode_fp8_cache_half_queries(case):
    run_case(case, LOW_DTYPE, num_splits=2, cache_dtype=FP8_KV_DTYPE, kv_scales=FP8_SCALES)


@pytest.mark.parametrize("block_n", [64, 128])
@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("case", SMALL)
def test_decode_fp8_qk_matches_reference(case, num_splits, block_n):
    """fp8_qk: q.K in float8 with q rounded per head (keys on the MMA's M side), over every shape (a window,
    padding rows, group 8, 128-wide heads), against the reference that rounds q the same way."""
    run_case(case, torch.float32, num_splits, cache_dtype=FP8_KV_DTYPE, kv_scales=FP8_SCALES, fp8_qk=True,
             block_n=block_n)


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("case", SMALL)
def test_decode_fp8_qk_pv_wgmma_matches_reference(case, num_splits):
    """pv_wgmma: fp8_qk's P.V with the values on the MMA's M side (acc^T = V^T . P), float32 and half queries,
    a soft cap; and only inside fp8_qk's loop."""
    run_case(case, torch.float32, num_splits, cache_dtype=FP8_KV_DTYPE, kv_scales=FP8_SCALES, fp8_qk=True,
             pv_wgmma=True)
    run_case(case, LOW_DTYPE, num_splits, cache_dtype=FP8_KV_DTYPE, kv_scales=FP8_SCALES, fp8_qk=True,
             pv_wgmma=True, logit_softcap=SOFTCAP)
    with pytest.raises(AssertionError, match="pv_wgmma"):
        run_case(case, torch.float32, num_splits, cache_dtype=FP8_KV_DTYPE, kv_scales=FP8_SCALES, fp8_qk=False,
                 pv_wgmma=True)


def test_decode_fp8_qk_half_queries_soft_cap():
    run_case(SMALL[2], LOW_DTYPE, 2, cache_dtype=FP8_KV_DTYPE, kv_scales=FP8_SCALES, fp8_qk=True)
    run_case(SMALL[3], torch.float32, 1, cache_dtype=FP8_KV_DTYPE, kv_scales=FP8_SCALES, fp8_qk=True,
             logit_softcap=SOFTCAP)


@triton.jit
def _quantize_heads_kernel(q_ptr, out_ptr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr):
    offs = tl.arange(0, BLOCK_G)[:, None] * BLOCK_D + tl.arange(0, BLOCK_D)[None, :]
    q8, scale = quantize_query_heads(tl.load(q_ptr + offs))
    tl.store(out_ptr + offs, q8.to(tl.float32) * scale[:, None])


def test_quantize_query_heads_rounds_as_torch():
    """The kernel's per-head float8 rounding of q is torch's, bit for bit: ties to even, carries into the
    exponent, subnormals (steps of 2^-9 below 2^-6 of the scaled row), the largest value, a row of zeros."""
    rows = [torch.randn(64) * 3]
    steps = torch.tensor([1.0 + k / 16 for k in range(16)])  # x.yyy1: halfway between e4m3 neighbours
    rows.append(torch.cat([448.0 * torch.ones(1), steps, steps / 8, steps * 16, -steps[:15] * 8]))  # scale 1: ties
    rows.append(torch.cat([448.0 * torch.ones(1), (torch.arange(63) - 31.5) * 2.0 ** -9]))  # subnormal ties
    rows.append(torch.cat([448.0 * torch.ones(1), torch.arange(63).float() * 2.0 ** -12]))  # tiny: subnormals, 0
    rows.append(torch.zeros(64))
    q = torch.stack(rows + [torch.randn(64) * 0.01 for _ in range(11)]).float()  # [16, 64]
    q = q.to(DEVICE)
    out = torch.empty_like(q)
    _quantize_heads_kernel[(1,)](q, out, BLOCK_G=16, BLOCK_D=64)
    assert torch.equal(out, quantize_query_heads_reference(q))


def test_decode_fp8_qk_rounds_q():
    """The reference's rounding of q is not a no-op here: fp8_qk's output differs from the unrounded reference by
    more than the float32 tolerance (so the test above sees the kernel round q, and round it as torch does)."""
    num_heads, num_kv_heads, head_dim, block_size, seq_lens, window = SMALL[1]
    kv_cache, block_tables = make_paged_kv(seq_lens, block_size, num_kv_heads, head_dim, FP8_KV_DTYPE, 0)
    q = randn((len(seq_lens), num_heads, head_dim), torch.float32, 1)
    args = (q, kv_cache[0], kv_cache[1], block_tables, torch.tensor(seq_lens, device=q.device),
            1 / math.sqrt(head_dim), window)
    rounded = paged_decode_attention_reference(*args, kv_scales=FP8_SCALES, fp8_qk=True)
    plain = paged_decode_attention_reference(*args, kv_scales=FP8_SCALES)
    assert (rounded - plain).abs().max() > 1e-3


@pytest.mark.parametrize("knobs", [dict(heads_first=True), dict(block_n=128), dict(num_stages=2),
                                   dict(block_n=128, heads_first=True), dict(block_n=32, num_warps=1),
                                   dict(head_halves=True, block_n=64, num_stages=2),
                                   dict(head_halves=True, block_n=32, num_warps=8)])
@pytest.mark.parametrize("case", [SMALL[1], SMALL[3]])
def test_decode_tuning_knobs_compute_the_same(case, knobs):
    """kernel_sweep attention's knobs (the grid's order, the tile, the pipeline) change no output, with a
    float8 cache and split over several programs."""
    run_case(case, torch.float32, 3, cache_dtype=FP8_KV_DTYPE, kv_scales=FP8_SCALES, **knobs)


@pytest.mark.parametrize("cache_dtype, num_splits, halves, wide, tiling", [
    (FP8_KV_DTYPE, 1, 4, 4, (128, 2, True)), (FP8_KV_DTYPE, 3, 4, 4, (64, 3, True)), (None, 1, 4, 4, (64, 3, False)),
    (FP8_KV_DTYPE, 1, 4, 5, (64, 3, True)), (FP8_KV_DTYPE, 1, 5, 5, (64, 3, False))])
def test_decode_tiling_of_a_float8_cache(cache_dtype, num_splits, halves, wide, tiling, monkeypatch):
    """decode_tiling: a float8 cache read by FP8_HALVES_PROGRAMS (sequence, KV head) programs or more runs its key
    loop over the head's halves, and in one split by FP8_WIDE_TILE_PROGRAMS or more over 128-key tiles in 2 stages
    (faster on the H200 from 32 and 128 sequences), and still computes the reference; a bf16 cache, or fewer
    programs, keeps 64-key tiles over 3 stages. (SMALL[1]'s 2 x 2 programs stand in for 128 x 8: a threshold of 4
    takes them, 5 does not.)"""
    monkeypatch.setattr(decode_module, "FP8_HALVES_PROGRAMS", halves)
    monkeypatch.setattr(decode_module, "FP8_WIDE_TILE_PROGRAMS", wide)
    monkeypatch.setattr(decode_module, "fp8_qk_on", lambda device: False)  # a GPU without float8 wgmma's tiling
    launches = record_split_launches(monkeypatch)
    run_case(SMALL[1], torch.float32, num_splits, cache_dtype=cache_dtype,
             kv_scales=FP8_SCALES if cache_dtype else KVScales())
    assert [(kw["BLOCK_N"], kw["num_stages"], kw["HALVES"]) for _, kw in launches] == [tiling]


@pytest.mark.parametrize("head_dim, fp8_qk, tiling", [(128, None, (64, 2, False, True)), (64, None, (64, 3, True, False)),
                                                     (128, False, (64, 3, True, False))])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_tiling_rounds_q_where_the_gpu_has_float8_mma(head_dim, fp8_qk, tiling, num_splits, monkeypatch):
    """decode_tiling on sm_90 (fp8_qk_on): a float8 cache's 128-wide heads read by FP8_HALVES_PROGRAMS programs or
    more round q to float8 for q.K (FP8_QK), in 64-key tiles over 2 stages whatever the splits, and compute the
    reference that rounds q; 64-wide heads, or fp8_qk=False, keep the converted keys' halves."""
    monkeypatch.setattr(decode_module, "FP8_HALVES_PROGRAMS", 4)
    monkeypatch.setattr(decode_module, "FP8_WIDE_TILE_PROGRAMS", 1 << 20)
    monkeypatch.setattr(decode_module, "fp8_qk_on", lambda device: True)
    launches = record_split_launches(monkeypatch)
    case = (8, 2, head_dim, 16, [300, 5], 0)  # 2 x 2 programs
    run_case(case, torch.float32, num_splits, cache_dtype=FP8_KV_DTYPE, kv_scales=FP8_SCALES, fp8_qk=fp8_qk,
             rounds_q=tiling[3])
    assert [(kw["BLOCK_N"], kw["num_stages"], kw["HALVES"], kw["FP8_QK"]) for _, kw in launches] == [tiling]


def test_decode_tiling_keywords_override_it(monkeypatch):
    """An explicit block_n, num_stages or head_halves wins over decode_tiling's (kernel_sweep's knobs)."""
    monkeypatch.setattr(decode_module, "FP8_HALVES_PROGRAMS", 1)
    monkeypatch.setattr(decode_module, "FP8_WIDE_TILE_PROGRAMS", 1)
    monkeypatch.setattr(decode_module, "fp8_qk_on", lambda device: False)
    launches = record_split_launches(monkeypatch)
    run_case(SMALL[1], torch.float32, 1, cache_dtype=FP8_KV_DTYPE, kv_scales=FP8_SCALES, block_n=32, num_stages=3,
             head_halves=False)
    assert [(kw["BLOCK_N"], kw["num_stages"], kw["HALVES"]) for _, kw in launches] == [(32, 3, False)]


def test_decode_fp8_cache_unit_scales():
    run_case(SMALL[4], torch.float32, num_splits=None, cache_dtype=FP8_KV_DTYPE)


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("case", [SMALL[0], SMALL[3]])
def test_decode_soft_cap_matches_reference(case, num_splits):
    run_case(case, torch.float32, num_splits, logit_softcap=SOFTCAP)


def test_decode_soft_cap_half_fp8_cache():
    run_case(SMALL[2], LOW_DTYPE, num_splits=2, logit_softcap=SOFTCAP)
    run_case(SMALL[3], torch.float32, num_splits=2, cache_dtype=FP8_KV_DTYPE, kv_scales=FP8_SCALES,
             logit_softcap=SOFTCAP)


def test_decode_soft_cap_changes_the_output():
    """The cap is not a no-op on these inputs: the capped reference differs from the uncapped one."""
    num_heads, num_kv_heads, head_dim, block_size, seq_lens, window = SMALL[3]
    kv_cache, block_tables = make_paged_kv(seq_lens, block_size, num_kv_heads, head_dim, torch.float32, 0)
    q = randn((len(seq_lens), num_heads, head_dim), torch.float32, 1)
    args = (q, kv_cache[0], kv_cache[1], block_tables, torch.tensor(seq_lens, device=q.device),
            1 / math.sqrt(head_dim), window)
    capped = paged_decode_attention_reference(*args, logit_softcap=SOFTCAP)
    assert (capped - paged_decode_attention_reference(*args)).abs().max() > 0.05


def test_decode_more_splits_than_tiles():
    run_case((8, 2, 64, 16, [70, 1], 0), torch.float32, num_splits=8)  # most splits are empty


def test_decode_accepts_int32_metadata():
    run_case(SMALL[3], torch.float32, num_splits=2, index_dtype=torch.int32)


@gpu_only
@pytest.mark.parametrize("num_splits", [1, 4, 16, None])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("case", LARGE)
def test_decode_matches_reference_large(case, dtype, num_splits):
    run_case(case, dtype, num_splits)


@gpu_only
@pytest.mark.parametrize("num_splits", [1, None])
@pytest.mark.parametrize("case", LARGE[:2])
def test_decode_soft_cap_matches_reference_large(case, num_splits):
    run_case(case, torch.bfloat16, num_splits, logit_softcap=50.0 / 16)  # Gemma 2's 50, scores ~16x ours


@gpu_only
@pytest.mark.parametrize("num_splits", [1, None])
@pytest.mark.parametrize("case", LARGE)
def test_decode_fp8_cache_matches_reference_large(case, num_splits):
    run_case(case, torch.bfloat16, num_splits, cache_dtype=FP8_KV_DTYPE, kv_scales=FP8_SCALES)


@gpu_only
@pytest.mark.parametrize("block_n, num_stages", [(64, 3), (64, 2), (128, 2)])  # kernel_sweep's fp8qk knobs
@pytest.mark.parametrize("num_splits", [1, None])
@pytest.mark.parametrize("case", LARGE)
def test_decode_fp8_qk_matches_reference_large(case, num_splits, block_n, num_stages):
    """fp8_qk on the GPU: sm_90's float8 wgmma over the key tiles, against the reference that rounds q per head."""
    run_case(case, torch.bfloat16, num_splits, cache_dtype=FP8_KV_DTYPE, kv_scales=FP8_SCALES, fp8_qk=True,
             block_n=block_n, num_stages=num_stages)


def test_default_num_splits_fits_the_h200_measurements(monkeypatch):
    monkeypatch.setattr(decode_module, "_sm_count", lambda device: 132)
    device = torch.device("cpu")
    splits = {batch: default_num_splits(batch, 8, 2048, 64, device) for batch in (1, 8, 32, 128, 256)}
    assert splits == {1: 4, 8: 8, 32: 2, 128: 1, 256: 1}


def test_wide_heads_split_by_keys_at_batch_one(monkeypatch):
    """256-wide heads take 32-key tiles: twice the splits at batch 1 (Gemma 2, kernel_sweep attention-gemma),
    the 8B shape's 4 at 128; batch 8 and up as before."""
    monkeypatch.setattr(decode_module, "_sm_count", lambda device: 132)
    cpu = torch.device("cpu")
    assert decode_num_splits(1, 8, 2048, 256, cpu) == 8 and decode_num_splits(1, 8, 2048, 128, cpu) == 4
    assert decode_num_splits(8, 8, 2048, 256, cpu) == default_num_splits(8, 8, 2048, 32, cpu) == 8
    assert decode_num_splits(1, 8, 64, 256, cpu) == 1  # a short cache still keeps 4 tiles a split


def test_default_num_splits_keeps_tiles_per_split():
    cpu = torch.device("cpu")  # 8 stand-in SMs
    assert default_num_splits(1, 8, 8192, 64, cpu) == 4  # 4 waves x 8 SMs / 8 heads
    assert default_num_splits(1, 1, 512, 64, cpu) == 2  # 8 tiles, 4 per split
    assert default_num_splits(1, 1, 16, 64, cpu) == 1


@pytest.mark.parametrize("fp8, fp8_qk", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_mixed_mode_computes_only_one_token_rows(num_splits, fp8, fp8_qk, monkeypatch):
    """Mixed step: q holds all new tokens; rows of sequences with one new token equal the reference,
    every other row of `out` is left as it was (here NaN), with and without the split merge. fp8: over a float8
    cache in decode_tiling's tiles of many programs (the head's halves; 128-key tiles in one split)."""
    num_heads, num_kv_heads, head_dim, block_size, window = 8, 2, 64, 16, 0
    seq_lens, new = [70, 40, 5, 300, 33], [1, 12, 1, 0, 1]  # decodes, a prefill chunk, no tokens
    scales = FP8_SCALES if fp8 else KVScales()
    if fp8:
        monkeypatch.setattr(decode_module, "FP8_HALVES_PROGRAMS", 1)
        monkeypatch.setattr(decode_module, "FP8_WIDE_TILE_PROGRAMS", 1)
    kv_cache, block_tables = make_paged_kv(seq_lens, block_size, num_kv_heads, head_dim,
                                           FP8_KV_DTYPE if fp8 else torch.float32, 0)
    launches = record_split_launches(monkeypatch)
    starts = torch.tensor([0] + new).cumsum(0).to(kv_cache.device)  # [B + 1]
    q = randn((int(starts[-1]), num_heads, head_dim), torch.float32, 1)
    out = torch.full_like(q, float("nan"))
    lens = torch.tensor(seq_lens, device=q.device)
    scale = 1 / math.sqrt(head_dim)
    got = paged_decode_attention(q, kv_cache[0], kv_cache[1], block_tables, lens, scale, window,
                                 num_splits=num_splits, query_start_loc=starts, out=out, kv_scales=scales,
                                 fp8_qk=fp8_qk)
    assert got is out
    assert [kw["HALVES"] for _, kw in launches] == [fp8 and not fp8_qk]
    rows = starts[:-1][torch.tensor(new) == 1]  # [3] rows of the decoding sequences
    one = torch.tensor(new, device=q.device) == 1
    expected = paged_decode_attention_reference(q[rows], kv_cache[0], kv_cache[1], block_tables[one], lens[one],
                                                scale, window, kv_scales=scales, fp8_qk=fp8_qk)
    assert_close(got[rows], expected)
    others = torch.ones(q.shape[0], dtype=torch.bool, device=q.device)
    others[rows] = False
    assert got[others].isnan().all()


def test_decode_reads_a_cache_stored_head_major():
    """The kernel takes the cache's strides: a cache stored [2, NB, Hkv, BS, D] (each head's page contiguous,
    kernel_sweep attention's layout experiment) and viewed in the kernel's index order gives the same output."""
    num_heads, num_kv_heads, head_dim, block_size, seq_lens, window = SMALL[1]
    kv_cache, tables = make_paged_kv(seq_lens, block_size, num_kv_heads, head_dim, FP8_KV_DTYPE, 0)
    two, blocks = kv_cache.shape[:2]
    major = torch.empty((two, blocks, num_kv_heads, block_size, head_dim), dtype=kv_cache.dtype,
                        device=kv_cache.device).permute(0, 1, 3, 2, 4)
    major.copy_(kv_cache)
    assert major.stride(2) == head_dim and major.stride(3) == block_size * head_dim
    q = randn((len(seq_lens), num_heads, head_dim), torch.float32, 1)
    lens = torch.tensor(seq_lens, device=q.device)
    got = paged_decode_attention(q, major[0], major[1], tables, lens, head_dim ** -0.5, window, num_splits=3,
                                 kv_scales=FP8_SCALES)
    want = paged_decode_attention_reference(q, kv_cache[0], kv_cache[1], tables, lens, head_dim ** -0.5, window,
                                            kv_scales=FP8_SCALES)
    assert_close(got, want)

