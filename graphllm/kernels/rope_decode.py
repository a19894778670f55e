"""Rotary embedding and the KV-cache write of a decode step's new token, inside the decode attention kernel.

At decode the rope_attention op ran two kernels a layer: rope_store_kv (rotate q and k, store k and v) and
paged_decode_attention's split kernel, each paying a launch, a ramp and a tail of a few microseconds at batch 1.
With `NewTokens` the split kernel does both (paged_decode_attention's ROPE constexpr): every program rotates
its query heads as it loads them, and the one program of each (sequence, KV head) whose key range holds the
new token (position seq_len - 1) rotates that token's key, stores it and the value at slot_mapping (a negative
slot, a CUDA-graph padding row, stores nothing), then waits at a barrier for its threads' stores before its key
loop reads the cache, the new key among the rest. No other program reads that token: the splits' ranges are
disjoint.

The rotation rounds where eager PyTorch rounds, as rope_store_kv does (x * cos + rotate_half(x) * sin, each
product and the sum rounded to x's dtype), so that the cache holds and the dots see the same values as on the
unfused path. rope_store_kv launches with fma contraction off for that; this kernel keeps it for its softmax
and instead multiplies through an inline asm `mul.rn.f32` (EXACT_MUL, on the GPU), which Triton can neither
contract nor turn into a bfloat16 multiply; under the interpreter the plain product is the same.
"""

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from graphllm.kernels.store_kv import quantize_fp8


class NewTokens(NamedTuple):
    """A decode step's unrotated new keys and values ([B, Hkv, D] each, last-dim stride 1: views of the qkv
    output may do), rotary cos and sin ([B, D], q's dtype, same strides) and slot_mapping ([B])."""
    k: torch.Tensor
    v: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    slot_mapping: torch.Tensor


def exact_mul_on(q: torch.Tensor) -> bool:
    """EXACT_MUL for queries q: the inline asm product on a GPU (the interpreter runs no asm)."""
    return q.is_cuda


@triton.jit
def _mul(a, b, EXACT_MUL: tl.constexpr):
    """a * b in float32, rounded once; EXACT_MUL: through an opaque asm so that nothing fuses it into an add."""
    if EXACT_MUL:
        return tl.inline_asm_elementwise("mul.rn.f32 $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.float32,
                                         is_pure=True, pack=1)
    return a * b


@triton.jit
def rotate_rows(x_ptrs, x, offs_d, mask, cos, sin, HALF: tl.constexpr, EXACT_MUL: tl.constexpr):
    """x * cos + rotate_half(x) * sin for rows x ([..., BLOCK_D], loaded from x_ptrs, which point at element
    offs_d of each row) with cos, sin ([BLOCK_D], float32); each product and the sum rounded to x's dtype."""
    partner = tl.where(offs_d < HALF, offs_d + HALF, offs_d - HALF)
    pair = tl.load(x_ptrs + (partner - offs_d), mask=mask, other=0.0)
    rotated = tl.where(offs_d < HALF, -pair, pair).to(tl.float32)
    dtype = x.dtype
    a = _mul(x.to(tl.float32), cos, EXACT_MUL).to(dtype)
    b = _mul(rotated, sin, EXACT_MUL).to(dtype)
    return (a.to(tl.float32) + b.to(tl.float32)).to(dtype)


@triton.jit
def store_new_token(k_ptr, v_ptr, cos, sin, slot_ptr, row, kvh, stride_kt, stride_kh, stride_vt, stride_vh,
                    k_cache_ptr, v_cache_ptr, stride_cb, stride_co, stride_ch, block_size, k_scale, v_scale,
                    offs_d, d_mask, HALF: tl.constexpr, KV_FP8: tl.constexpr, EXACT_MUL: tl.constexpr):
    """Rotate token `row`'s key of KV head kvh and store it with its value at slot_mapping[row] (skipped for
    a negative slot); a float8 cache takes saturate(x / scale), as store_kv and rope_store_kv store it."""
    slot = tl.load(slot_ptr + row).to(tl.int64)
    if slot >= 0:
        k_ptrs = k_ptr + row * stride_kt + kvh * stride_kh + offs_d
        k = rotate_rows(k_ptrs, tl.load(k_ptrs, mask=d_mask, other=0.0), offs_d, d_mask, cos, sin, HALF, EXACT_MUL)
        v = tl.load(v_ptr + row * stride_vt + kvh * stride_vh + offs_d, mask=d_mask, other=0.0)
        if KV_FP8:
            k, v = quantize_fp8(k, k_scale), quantize_fp8(v, v_scale)
        cache_off = (slot // block_size) * stride_cb + (slot % block_size) * stride_co + kvh * stride_ch + offs_d
        cache_ty = k_cache_ptr.dtype.element_ty
        tl.store(k_cache_ptr + cache_off, k.to(cache_ty), mask=d_mask)
        tl.store(v_cache_ptr + cache_off, v.to(cache_ty), mask=d_mask)
