"""Rotary embedding of q and k plus the KV-cache write of a step's new tokens, in one Triton kernel.

Replaces what a decoder layer ran between its qkv projection and attention: Inductor's rotary
kernels (one for q, one for k) and graphllm's store_kv. Program (t, j) takes token t and a block
of BLOCK_H heads: blocks j < cdiv(Hq, BLOCK_H) rotate query heads into a new contiguous
q_rot [T, Hq, D]; the others rotate key heads and store them with their value heads at
slot_mapping[t] (skipped for a negative slot, a CUDA-graph padding token).

The rotation is transformers' rotate-half form, x * cos + rotate_half(x) * sin with cos, sin
[T, D] in x's dtype, and it rounds where eager PyTorch rounds: each product to x's dtype, then
the sum, so it is meant to be bit-identical to the eager expression (it is under the
interpreter). On the H200, Triton's fma contraction skipped a product's rounding (17% of
bfloat16 outputs off by a rounding step), so the kernel launches with enable_fp_fusion=False
(LAUNCH_OPTIONS); its sm_90 PTX then has no fma (tests/kernels/sm90_compile.py), and on the H200
the bf16 teacher-forced agreement with it equals the unfused path's (benchmarks/RESULTS.md). A
float8 cache stores the rotated key as saturate(k / k_scale), as store_kv does.
"""

import torch
import triton
import triton.language as tl

from graphllm.kernels.gdc import dependent_start
from graphllm.kernels.launch import pdl_launch
from graphllm.kernels.store_kv import quantize_fp8, store_kv_reference
from graphllm.kernels.kv_quant import KVScales, is_fp8
from graphllm.kernels.rotary import apply_rotary

# No fma contraction: with it Triton fused each rounded product into the sum (fma.rn.bf16 in the
# sm_90 PTX), so 17% of bf16 outputs were off eager's by a rounding step on the H200. Without it
# the PTX rounds every product (mul.rn.bf16) before the add (tests/kernels/sm90_compile.py).
LAUNCH_OPTIONS = {"enable_fp_fusion": False}


def rope_store_kv_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor,
                            sin: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
                            kv_scales: KVScales = KVScales()) -> torch.Tensor:
    """The PyTorch oracle (slots must be valid, >= 0): returns q rotated, stores k rotated and v."""
    store_kv_reference(apply_rotary(k, cos, sin), v, kv_cache, slot_mapping, kv_scales)
    return apply_rotary(q, cos, sin)


@triton.jit
def _rotate(x_ptr, row, offs_h, offs_d, mask, stride_h, cos1, cos2, sin1, sin2, HALF: tl.constexpr):
    """The two halves of rotate-half rope over heads offs_h of one token: x * cos + rotate_half(x) * sin,
    each product and the sum rounded to x's dtype."""
    ptrs = x_ptr + row + offs_h[:, None] * stride_h + offs_d[None, :]
    x1 = tl.load(ptrs, mask=mask)  # [BLOCK_H, BLOCK_HALF]
    x2 = tl.load(ptrs + HALF, mask=mask)
    dtype = x1.dtype
    a1 = (x1.to(tl.float32) * cos1).to(dtype)
    b1 = (-x2.to(tl.float32) * sin1).to(dtype)
    a2 = (x2.to(tl.float32) * cos2).to(dtype)
    b2 = (x1.to(tl.float32) * sin2).to(dtype)
    return (a1.to(tl.float32) + b1.to(tl.float32)).to(dtype), (a2.to(tl.float32) + b2.to(tl.float32)).to(dtype)


@triton.jit
def _rope_store_kv_kernel(q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
                          stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ct,
                          stride_ot, stride_oh, stride_cb, stride_co, stride_ch,  # cache: block, offset, head
                          block_size, num_heads, num_kv_heads, k_scale, v_scale,
                          HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
                          KV_FP8: tl.constexpr, PDL: tl.constexpr = False):
    if PDL:  # launched as a programmatic dependent (launch.py): nothing is read before the kernels before are done
        dependent_start()
    t, j = tl.program_id(0).to(tl.int64), tl.program_id(1)
    q_blocks = tl.cdiv(num_heads, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_HALF)
    d_mask = offs_d < HALF
    cos1 = tl.load(cos_ptr + t * stride_ct + offs_d, mask=d_mask).to(tl.float32)[None, :]
    cos2 = tl.load(cos_ptr + t * stride_ct + HALF + offs_d, mask=d_mask).to(tl.float32)[None, :]
    sin1 = tl.load(sin_ptr + t * stride_ct + offs_d, mask=d_mask).to(tl.float32)[None, :]
    sin2 = tl.load(sin_ptr + t * stride_ct + HALF + offs_d, mask=d_mask).to(tl.float32)[None, :]
    if j < q_blocks:
        offs_h = j * BLOCK_H + tl.arange(0, BLOCK_H)
        mask = (offs_h[:, None] < num_heads) & d_mask[None, :]
        r1, r2 = _rotate(q_ptr, t * stride_qt, offs_h, offs_d, mask, stride_qh, cos1, cos2, sin1, sin2, HALF)
        out = q_out_ptr + t * stride_ot + offs_h[:, None] * stride_oh + offs_d[None, :]
        tl.store(out, r1, mask=mask)
        tl.store(out + HALF, r2, mask=mask)
    else:
        slot = tl.load(slot_ptr + t).to(tl.int64)
        if slot >= 0:
            offs_h = (j - q_blocks) * BLOCK_H + tl.arange(0, BLOCK_H)
            mask = (offs_h[:, None] < num_kv_heads) & d_mask[None, :]
            r1, r2 = _rotate(k_ptr, t * stride_kt, offs_h, offs_d, mask, stride_kh, cos1, cos2, sin1, sin2, HALF)
            v_ptrs = v_ptr + t * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :]
            v1 = tl.load(v_ptrs, mask=mask)
            v2 = tl.load(v_ptrs + HALF, mask=mask)
            if KV_FP8:
                r1, r2 = quantize_fp8(r1, k_scale), quantize_fp8(r2, k_scale)
                v1, v2 = quantize_fp8(v1, v_scale), quantize_fp8(v2, v_scale)
            cache_off = ((slot // block_size) * stride_cb + (slot % block_size) * stride_co
                         + offs_h[:, None] * stride_ch + offs_d[None, :])
            cache_ty = k_cache_ptr.dtype.element_ty
            tl.store(k_cache_ptr + cache_off, r1.to(cache_ty), mask=mask)
            tl.store(k_cache_ptr + cache_off + HALF, r2.to(cache_ty), mask=mask)
            tl.store(v_cache_ptr + cache_off, v1.to(cache_ty), mask=mask)
            tl.store(v_cache_ptr + cache_off + HALF, v2.to(cache_ty), mask=mask)


def rope_store_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
                  kv_scales: KVScales = KVScales()) -> torch.Tensor:
    """Rotate q ([T, Hq, D]) and k ([T, Hkv, D]) by cos, sin ([T, D], q's dtype); store rotated k and v
    into kv_cache ([2, NB, BS, Hkv, D]) at slot_mapping ([T], negative = skip). Returns q rotated,
    contiguous. q, k, v may be strided views (slices of a fused qkv output) with last-dim stride 1.
    """
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    assert head_dim % 2 == 0 and cos.shape == sin.shape == (num_tokens, head_dim) and cos.stride() == sin.stride()
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if num_tokens == 0:
        return q_out
    q, k, v, cos, sin = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v, cos, sin))
    k_cache, v_cache = kv_cache[0], kv_cache[1]  # [NB, BS, Hkv, D] each
    assert k_cache.stride(-1) == 1 and v_cache.stride() == k_cache.stride()
    block_h = min(triton.next_power_of_2(num_kv_heads), 8)
    grid = (num_tokens, triton.cdiv(num_heads, block_h) + triton.cdiv(num_kv_heads, block_h))
    _rope_store_kv_kernel[grid](
        q, k, v, cos, sin, q_out, k_cache, v_cache, slot_mapping,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), cos.stride(0),
        q_out.stride(0), q_out.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        k_cache.shape[1], num_heads, num_kv_heads, kv_scales.k, kv_scales.v,
        HALF=head_dim // 2, BLOCK_H=block_h, BLOCK_HALF=triton.next_power_of_2(head_dim // 2),
        KV_FP8=is_fp8(kv_cache.dtype), num_warps=4 if block_h * head_dim >= 1024 else 1, **LAUNCH_OPTIONS,
        **pdl_launch(q.device))
    return q_out
