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

With `HeadNorms` (Qwen3's q_norm / k_norm, Gemma 3's with unit_offset) the heads are RMS-normed first, in the same
program: each row's rstd from the tile it already holds, the rotary's partner elements normed by the same rstd and
their own weights (head_norm). The norm rounds where reference_rms_norm rounds; only the float32 sum of squares
is in another order than the row kernel's or Inductor's, so the fused path agrees with norm-then-rotary to a
rounding of the normed value, not bit for bit. rotary.normed_heads is the same norm for the paths that do not
fuse it.
"""

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from graphllm.kernels.rotary import HeadNorms
from graphllm.kernels.store_kv import quantize_fp8


class NewTokens(NamedTuple):
    """A decode step's unrotated new keys and values ([B, Hkv, D] each, last-dim stride 1: views of the qkv
    output may do), rotary cos and sin ([B, D], q's dtype, same strides) and slot_mapping ([B]); norms: the
    heads' RMSNorm before the rotary, when the model has one."""
    k: torch.Tensor
    v: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    slot_mapping: torch.Tensor
    norms: HeadNorms | None = None


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
def head_rstd(x, eps, HEAD_DIM: tl.constexpr):
    """rsqrt(mean(x^2) + eps) of each row of x ([BLOCK_G, BLOCK_D], masked lanes 0) as [BLOCK_G, 1] float32."""
    xf = x.to(tl.float32)
    return tl.rsqrt(tl.sum(xf * xf, axis=1) / HEAD_DIM + eps)[:, None]


@triton.jit
def head_norm(x, rstd, w_ptr, offs_d, HEAD_DIM: tl.constexpr, UNIT_OFFSET: tl.constexpr, EXACT_MUL: tl.constexpr):
    """x (elements offs_d of their rows) normed by rstd and scaled by the weights at offs_d, rounded as
    reference_rms_norm rounds: to x's dtype after the norm and after the scale, or with UNIT_OFFSET once, after
    the float32 scale by 1 + weight. The scale is _mul's (else the compiler makes it a bfloat16 fma: the same
    value, as the float32 product of two bfloat16 values is exact, but not what the sm_90 check can tell apart)."""
    w = tl.load(w_ptr + offs_d, mask=offs_d < HEAD_DIM, other=0.0).to(tl.float32)
    normed = x.to(tl.float32) * rstd
    if UNIT_OFFSET:
        return (normed * (1.0 + w)).to(x.dtype)
    return _mul(w, normed.to(x.dtype).to(tl.float32), EXACT_MUL).to(x.dtype)


@triton.jit
def rotate_rows(x_ptrs, x, offs_d, mask, cos, sin, HALF: tl.constexpr, EXACT_MUL: tl.constexpr,
                norm_w_ptr, rstd, NORM: tl.constexpr, UNIT_OFFSET: tl.constexpr):
    """x * cos + rotate_half(x) * sin for rows x ([..., BLOCK_D], loaded from x_ptrs, which point at element
    offs_d of each row) with cos, sin ([BLOCK_D], float32); each product and the sum rounded to x's dtype.
    NORM: x and its partner elements head_norm-ed by rstd (the rows') and norm_w_ptr's weights first."""
    partner = tl.where(offs_d < HALF, offs_d + HALF, offs_d - HALF)
    pair = tl.load(x_ptrs + (partner - offs_d), mask=mask, other=0.0)
    if NORM:
        x = head_norm(x, rstd, norm_w_ptr, offs_d, 2 * HALF, UNIT_OFFSET, EXACT_MUL)
        pair = head_norm(pair, rstd, norm_w_ptr, partner, 2 * HALF, UNIT_OFFSET, EXACT_MUL)
    rotated = tl.where(offs_d < HALF, -pair, pair).to(tl.float32)
    dtype = x.dtype
    a = _mul(x.to(tl.float32), cos, EXACT_MUL).to(dtype)
    b = _mul(rotated, sin, EXACT_MUL).to(dtype)
    return (a.to(tl.float32) + b.to(tl.float32)).to(dtype)


@triton.jit
def store_new_token(k_ptr, v_ptr, cos, sin, slot_ptr, row, kvh, stride_kt, stride_kh, stride_vt, stride_vh,
                    k_cache_ptr, v_cache_ptr, stride_cb, stride_co, stride_ch, block_size, k_scale, v_scale,
                    offs_d, d_mask, HALF: tl.constexpr, KV_FP8: tl.constexpr, EXACT_MUL: tl.constexpr,
                    k_norm_ptr, norm_eps, NORM: tl.constexpr, UNIT_OFFSET: tl.constexpr):
    """Rotate token `row`'s key of KV head kvh (NORM: RMS-normed by k_norm_ptr's weights first) and store it
    with its value at slot_mapping[row] (skipped for a negative slot); a float8 cache takes saturate(x / scale),
    as store_kv and rope_store_kv store it."""
    slot = tl.load(slot_ptr + row).to(tl.int64)
    if slot >= 0:
        k_ptrs = k_ptr + row * stride_kt + kvh * stride_kh + offs_d
        k = tl.load(k_ptrs, mask=d_mask, other=0.0)
        rstd = 1.0
        if NORM:
            kf = k.to(tl.float32)
            rstd = tl.rsqrt(tl.sum(kf * kf, axis=0) / (2 * HALF) + norm_eps)
        k = rotate_rows(k_ptrs, k, offs_d, d_mask, cos, sin, HALF, EXACT_MUL, k_norm_ptr, rstd, NORM, UNIT_OFFSET)
        v = tl.load(v_ptr + row * stride_vt + kvh * stride_vh + offs_d, mask=d_mask, other=0.0)
        if KV_FP8:
            k, v = quantize_fp8(k, k_scale), quantize_fp8(v, v_scale)
        cache_off = (slot // block_size) * stride_cb + (slot % block_size) * stride_co + kvh * stride_ch + offs_d
        cache_ty = k_cache_ptr.dtype.element_ty
        tl.store(k_cache_ptr + cache_off, k.to(cache_ty), mask=d_mask)
        tl.store(v_cache_ptr + cache_off, v.to(cache_ty), mask=d_mask)
