"""Store each new token's key and value into its paged KV-cache slot, in one Triton kernel.

kv_cache of one layer is [2, num_blocks, block_size, Hkv, D] (0 = keys, 1 = values); token t
goes to slot slot_mapping[t] = block * block_size + offset. One program per token writes its
[Hkv, D] key and value tiles, cast to the cache dtype; into a float8 cache as saturate(x / scale)
in float32 (graphllm/kernels/kv_quant.py). A negative slot means "padding token, do not store"
(CUDA-graph batches padded to a bucket), which the reference does not accept.
"""

import torch
import triton
import triton.language as tl

from graphllm.kernels.reference import write_kv_cache
from graphllm.kernels.kv_quant import FP8_MAX, KVScales, is_fp8

_FP8_MAX = tl.constexpr(FP8_MAX)


def store_kv_reference(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                       slot_mapping: torch.Tensor, kv_scales: KVScales = KVScales()) -> None:
    """The PyTorch oracle: index_copy_ into the flat slots (slots must be valid, >= 0)."""
    write_kv_cache(k, v, kv_cache, slot_mapping, kv_scales)


@triton.jit
def quantize_fp8(x, scale):
    """saturate(x / scale) in float32, ready for the cast to float8 (NaN stays NaN)."""
    x = tl.div_rn(x.to(tl.float32), scale)
    x = tl.maximum(x, -_FP8_MAX, propagate_nan=tl.PropagateNan.ALL)
    return tl.minimum(x, _FP8_MAX, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _store_kv_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
                     stride_kt, stride_kh, stride_vt, stride_vh,
                     stride_cb, stride_co, stride_ch,  # k/v cache: block, offset, head
                     block_size, num_kv_heads, head_dim, k_scale, v_scale,
                     BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, KV_FP8: tl.constexpr):
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot >= 0:
        offs_h = tl.arange(0, BLOCK_H)
        offs_d = tl.arange(0, BLOCK_D)
        mask = (offs_h[:, None] < num_kv_heads) & (offs_d[None, :] < head_dim)  # [BLOCK_H, BLOCK_D]
        cache_off = ((slot // block_size) * stride_cb + (slot % block_size) * stride_co
                     + offs_h[:, None] * stride_ch + offs_d[None, :])
        t64 = t.to(tl.int64)
        k = tl.load(k_ptr + t64 * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :],
                    mask=mask)  # [BLOCK_H, BLOCK_D]
        v = tl.load(v_ptr + t64 * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :],
                    mask=mask)
        if KV_FP8:  # compile-time: other caches keep the plain cast
            k = quantize_fp8(k, k_scale)
            v = quantize_fp8(v, v_scale)
        tl.store(k_cache_ptr + cache_off, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
        tl.store(v_cache_ptr + cache_off, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def store_kv(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
             slot_mapping: torch.Tensor, kv_scales: KVScales = KVScales()) -> None:
    """Write k, v ([T, Hkv, D], any dtype) into kv_cache ([2, NB, BS, Hkv, D]) in place.

    slot_mapping: [T] int64 (or int32), slot = block * block_size + offset; negative = skip.
    k and v may be strided views (e.g. slices of a fused qkv output) with last-dim stride 1.
    A float8_e4m3fn cache stores saturate(k / kv_scales.k) and saturate(v / kv_scales.v).
    """
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    k = k if k.stride(-1) == 1 else k.contiguous()
    v = v if v.stride(-1) == 1 else v.contiguous()
    k_cache, v_cache = kv_cache[0], kv_cache[1]  # [NB, BS, Hkv, D] each
    assert k_cache.stride(-1) == 1 and v_cache.stride() == k_cache.stride()
    _store_kv_kernel[(num_tokens,)](
        k, v, k_cache, v_cache, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        k_cache.shape[1], num_kv_heads, head_dim, kv_scales.k, kv_scales.v,
        BLOCK_H=triton.next_power_of_2(num_kv_heads), BLOCK_D=triton.next_power_of_2(head_dim),
        KV_FP8=is_fp8(kv_cache.dtype), num_warps=4 if num_kv_heads * head_dim >= 1024 else 1)
