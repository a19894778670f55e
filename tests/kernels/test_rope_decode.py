"""The decode kernel with the new token's rotary embedding and cache write inside (rope_decode.py) gives what
rope_store_kv followed by paged_decode_attention gives: the same output and the same cache, bit for bit (both
round where eager PyTorch rounds), over a cache of q's dtype or a float8 one, split or not, with a window, with
CUDA-graph padding rows (seq_len 0, slot -1), and from strided views of a fused qkv output. With HeadNorms the
kernel RMS-norms the heads first: the same rows as normed_heads, rope_store_kv and the decode kernel, up to the
rounding of a normed value (the sum of squares in another order)."""

import math

import pytest
import torch

pytest.importorskip("triton")

from graphllm.kernels.kv_quant import FP8_KV_DTYPE, KVScales  # noqa: E402
from graphllm.kernels.paged_decode_attention import paged_decode_attention  # noqa: E402
from graphllm.kernels.rope_decode import NewTokens  # noqa: E402
from graphllm.kernels.rope_store_kv import rope_store_kv  # noqa: E402
from graphllm.kernels.rotary import HeadNorms, normed_heads  # noqa: E402
from tests.kernels.conftest import LOW_DTYPE, make_paged_kv, randn  # noqa: E402

# (Hq, Hkv, D, block_size, seq_lens, sliding_window)
CASES = [
    (4, 4, 64, 16, [1, 16, 37], 0),  # the new token alone, at the end of a block, in a partial block
    (8, 2, 128, 16, [300, 5], 0),  # several tiles per split
    (16, 2, 96, 8, [48, 130], 0),  # group 8; head width not a power of two
    (8, 2, 64, 32, [200, 3, 64], 50),  # a window
    (4, 4, 64, 16, [0, 33], 0),  # a padding row: seq_len 0, slot -1
]


def step_inputs(case, dtype, cache_dtype, seed=0):
    """(q, k, v as views of one qkv row buffer, cos, sin, kv_cache with NaN in every new token's slot, block
    tables, seq_lens, slot_mapping)."""
    num_heads, num_kv_heads, head_dim, block_size, seq_lens, _ = case
    kv_cache, tables = make_paged_kv(seq_lens, block_size, num_kv_heads, head_dim, torch.float32, seed)
    batch = len(seq_lens)
    slots = torch.tensor([int(tables[b, (n - 1) // block_size]) * block_size + (n - 1) % block_size if n else -1
                          for b, n in enumerate(seq_lens)], device=kv_cache.device)
    flat = kv_cache.view(2, -1, num_kv_heads, head_dim)
    flat[:, slots[slots >= 0]] = float("nan")  # not there yet: a kernel that read it before storing it gives NaN
    qkv = randn((batch, (num_heads + 2 * num_kv_heads) * head_dim), dtype, seed + 1)
    q, k, v = qkv.split([num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=1)
    q, k, v = (x.view(batch, -1, head_dim) for x in (q, k, v))
    angles = randn((batch, head_dim // 2), torch.float32, seed + 2) * 3
    cos = torch.cat([angles.cos()] * 2, 1).to(dtype)
    sin = torch.cat([angles.sin()] * 2, 1).to(dtype)
    lens = torch.tensor(seq_lens, device=q.device)
    return q, k, v, cos, sin, kv_cache.to(cache_dtype or dtype), tables, lens, slots


def both_paths(case, dtype, num_splits, cache_dtype=None, kv_scales=KVScales(), norms=None, **knobs):
    q, k, v, cos, sin, kv_cache, tables, lens, slots = step_inputs(case, dtype, cache_dtype)
    window, scale = case[5], 1 / math.sqrt(case[2])
    unfused_cache, fused_cache = kv_cache.clone(), kv_cache.clone()
    q_normed, k_normed = normed_heads(q, k, norms)
    q_rot = rope_store_kv(q_normed, k_normed, v, cos, sin, unfused_cache, slots, kv_scales)
    unfused = paged_decode_attention(q_rot, unfused_cache[0], unfused_cache[1], tables, lens, scale, window,
                                     num_splits, kv_scales, **knobs)
    fused = paged_decode_attention(q, fused_cache[0], fused_cache[1], tables, lens, scale, window, num_splits,
                                   kv_scales, new_tokens=NewTokens(k, v, cos, sin, slots, norms), **knobs)
    return unfused, fused, unfused_cache, fused_cache


def assert_same(unfused, fused, unfused_cache, fused_cache):
    assert not fused.isnan().any()
    assert torch.equal(fused, unfused)
    assert torch.equal(fused_cache.view(torch.uint8), unfused_cache.view(torch.uint8))  # NaNs, float8 alike


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("case", CASES)
def test_fused_rope_decode_equals_rope_store_kv_then_decode_fp32(case, num_splits):
    assert_same(*both_paths(case, torch.float32, num_splits))


def head_norms(head_dim: int, dtype, unit_offset: bool = False) -> HeadNorms:
    """Weights far from 1 (a norm that scales nothing would pass unnoticed), q's and k's unlike each other."""
    return HeadNorms(randn((head_dim,), dtype, 7) + 1.5, randn((head_dim,), dtype, 8) * 2, 1e-6, unit_offset)


def assert_close(unfused, fused, unfused_cache, fused_cache, tol: float):
    new = unfused_cache.isnan()  # the NaN slots of padding rows stay NaN on both paths
    assert not fused.isnan().any() and torch.equal(new, fused_cache.isnan())
    torch.testing.assert_close(fused, unfused, atol=tol, rtol=tol)
    torch.testing.assert_close(fused_cache.float().nan_to_num(), unfused_cache.float().nan_to_num(), atol=tol, rtol=tol)


@pytest.mark.parametrize("unit_offset", [False, True])
@pytest.mark.parametrize("case", [CASES[0], CASES[2], CASES[4]])
def test_fused_head_norms_equal_the_norms_then_rope_store_kv_fp32(case, unit_offset):
    norms = head_norms(case[2], torch.float32, unit_offset)
    assert_close(*both_paths(case, torch.float32, 2, norms=norms), tol=1e-5)


def test_fused_head_norms_half_and_float8_cache():
    case = CASES[1]
    assert_close(*both_paths(case, LOW_DTYPE, 2, norms=head_norms(case[2], LOW_DTYPE)), tol=2e-2)
    norms = head_norms(case[2], torch.float32)
    assert_close(*both_paths(case, torch.float32, 1, FP8_KV_DTYPE, KVScales(k=0.37, v=1.9), norms=norms,
                             fp8_qk=False), tol=1e-5)


def test_fused_head_norms_change_the_rows():
    """The norms are applied: without them the kernel's output and cache differ."""
    case = CASES[1]
    normed, _, normed_cache, _ = both_paths(case, torch.float32, 2, norms=head_norms(case[2], torch.float32))
    plain, _, plain_cache, _ = both_paths(case, torch.float32, 2)
    assert not torch.allclose(normed, plain) and not torch.allclose(normed_cache.nan_to_num(), plain_cache.nan_to_num())


@pytest.mark.parametrize("num_splits", [1, 3])
def test_fused_rope_decode_over_the_heads_halves(num_splits):
    """The rotary with head_halves (the key loop over the two halves of the head's dims): the same rows."""
    assert_same(*both_paths(CASES[1], torch.float32, num_splits, head_halves=True))


@pytest.mark.parametrize("case", CASES[1:4])
def test_fused_rope_decode_equals_rope_store_kv_then_decode_half(case):
    assert_same(*both_paths(case, LOW_DTYPE, 2))


# decode_tiling's, as at 128+ sequences: one split, the 128-key tiles over the head's halves; two, 64-key halves
@pytest.mark.parametrize("num_splits", [1, 2])
@pytest.mark.parametrize("case", [CASES[0], CASES[3], CASES[4]])
def test_fused_rope_decode_over_a_float8_cache(case, num_splits, monkeypatch):
    import graphllm.kernels.paged_decode_attention as decode
    monkeypatch.setattr(decode, "FP8_HALVES_PROGRAMS", 1)
    monkeypatch.setattr(decode, "FP8_WIDE_TILE_PROGRAMS", 1)
    monkeypatch.setattr(decode, "fp8_qk_on", lambda device: False)  # the converted keys' tiles on any GPU
    assert_same(*both_paths(case, torch.float32, num_splits, FP8_KV_DTYPE, KVScales(k=0.37, v=1.9)))


@pytest.mark.parametrize("num_splits", [1, 2])
def test_fused_rope_decode_with_fp8_qk(num_splits):
    """q.K in float8 (fp8_qk) after the kernel's own rotary: q is rounded per head once rotated, as it is after
    rope_store_kv, so both paths give the same rows and caches."""
    assert_same(*both_paths(CASES[3], torch.float32, num_splits, FP8_KV_DTYPE, KVScales(k=0.37, v=1.9),
                            fp8_qk=True))


def test_fused_rope_decode_stores_the_rotated_key():
    """It did write the new token (the NaN in its slot is gone) and rotated it: not the raw key."""
    case = CASES[1]
    q, k, v, cos, sin, kv_cache, tables, lens, slots = step_inputs(case, torch.float32, None)
    paged_decode_attention(q, kv_cache[0], kv_cache[1], tables, lens, 1 / math.sqrt(case[2]), 0, 2,
                           new_tokens=NewTokens(k, v, cos, sin, slots))
    stored = kv_cache.view(2, -1, case[1], case[2])[:, slots]
    assert not stored.isnan().any()
    assert torch.equal(stored[1], v) and not torch.allclose(stored[0], k)


@pytest.mark.parametrize("fuse", [True, False])
def test_triton_backend_rope_forward_at_decode(fuse, monkeypatch):
    """graphllm.rope_attention at decode (T == B) through the triton backend: with fuse_rope_decode the decode
    kernel alone (rope_store_kv never launches), without it rope_store_kv first; the same output and cache."""
    import graphllm.backends.triton_backend as tb
    case = CASES[1]
    q, k, v, cos, sin, kv_cache, tables, lens, slots = step_inputs(case, torch.float32, None)
    expected, _, expected_cache, _ = both_paths(case, torch.float32, None)
    launched = []
    monkeypatch.setattr(tb, "rope_store_kv", lambda *a: launched.append(1) or rope_store_kv(*a))
    backend = tb.TritonBackend()
    backend.fuse_rope_decode = fuse
    starts = torch.arange(len(case[4]) + 1, device=q.device)
    got = backend.rope_forward(q, k, v, cos, sin, kv_cache, lens - 1, slots, tables, lens, starts,
                               1 / math.sqrt(case[2]), case[5])
    assert torch.equal(got, expected) and torch.equal(kv_cache.view(torch.uint8), expected_cache.view(torch.uint8))
    assert launched == ([] if fuse else [1])
