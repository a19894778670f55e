"""The pure-PyTorch references of graphllm's ops: what the CPU runs and the oracle of every kernel.

Plain torch, no triton (the CPU install has none):
  reference_rms_norm      RMSNorm, op by op as graphllm.models.layers.RMSNorm (bit-identical on CPU)
  reference_silu_and_mul  silu(gate) * up, the same ops as LlamaMLP
  write_kv_cache          the KV-cache store of the attention op (kv_quant's float8 format too)
  reference_attention     causal paged attention over gathered pages, in float32
  soft_cap                Gemma 2's logit soft-capping, cap * tanh(x / cap)

The paged KV cache is one [2, num_blocks, block_size, Hkv, D] tensor per layer; the step
metadata (slot_mapping, block_tables, query_start_loc, positions) is described in
graphllm/ops/attention.py.
"""

import torch
import torch.nn.functional as F

from graphllm.kernels.kv_quant import KVScales, dequantize_kv, is_fp8, quantize_kv


def reference_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, unit_offset: bool = False) -> torch.Tensor:
    """x: [..., D], weight: [D] -> [..., D]. Keep in step with graphllm.models.layers.RMSNorm; with
    unit_offset, with graphllm.models.gemma.GemmaRMSNorm (scaled by 1 + weight in float32, then cast)."""
    dtype = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)  # [..., D] float32
    if unit_offset:
        return (xf * (1.0 + weight.float())).to(dtype)  # x's dtype, like Gemma's module
    return weight * xf.to(dtype)  # dtype: promote(weight, x), like the module


def reference_gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x: [..., 2I] -> [..., I]; GemmaMLP's GeGLU, gelu(gate, approximate="tanh") * up, in x's dtype."""
    size = x.shape[-1] // 2
    gate, up = x[..., :size], x[..., size:]
    return F.gelu(gate, approximate="tanh") * up


def reference_silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x: [..., 2I] -> [..., I]; the same ops as LlamaMLP, in x's dtype (bit-identical on CPU)."""
    size = x.shape[-1] // 2
    gate, up = x[..., :size], x[..., size:]  # [..., I] views, like split_with_sizes gives
    return F.silu(gate) * up


def write_kv_cache(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                   slot_mapping: torch.Tensor, kv_scales: KVScales = KVScales()) -> None:
    """Store the new keys and values at their slots. kv_cache: [2, num_blocks, block_size, Hkv, D]."""
    flat = kv_cache.view(2, -1, kv_cache.shape[-2], kv_cache.shape[-1])  # [2, slots, Hkv, D]
    k = quantize_kv(k, kv_cache.dtype, kv_scales.k)
    v = quantize_kv(v, kv_cache.dtype, kv_scales.v)
    if is_fp8(kv_cache.dtype):  # index_copy_ has no float8 kernel: copy the bytes
        flat, k, v = flat.view(torch.uint8), k.view(torch.uint8), v.view(torch.uint8)
    flat[0].index_copy_(0, slot_mapping, k)
    flat[1].index_copy_(0, slot_mapping, v)


def soft_cap(scores: torch.Tensor, cap: float) -> torch.Tensor:
    """cap * tanh(scores / cap), as transformers' Gemma 2 computes it; cap <= 0: scores unchanged."""
    return cap * torch.tanh(scores / cap) if cap > 0 else scores


def reference_attention(q: torch.Tensor, kv_cache: torch.Tensor, positions: torch.Tensor,
                        block_tables: torch.Tensor, query_start_loc: torch.Tensor,
                        scale: float, sliding_window: int, kv_scales: KVScales = KVScales(),
                        logit_softcap: float = 0.0) -> torch.Tensor:
    """Causal attention of every new token over its sequence's pages, in float32.

    q: [T, Hq, D]; returns [T, Hq, D]. Materialises [T, L, Hkv, D] keys (L = M * block_size):
    meant for small CPU batches and tests, not for speed. kv_scales: read a float8 cache with them.
    logit_softcap > 0: the scaled scores become soft_cap(scores, logit_softcap) before the mask.
    """
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = kv_cache.shape[3]
    token_ids = torch.arange(num_tokens, device=q.device)
    seq_of_token = torch.searchsorted(query_start_loc[1:], token_ids, right=True)  # [T]
    blocks = block_tables[seq_of_token]  # [T, M]
    keys = dequantize_kv(kv_cache[0][blocks].flatten(1, 2), kv_scales.k)  # [T, L, Hkv, D] float32
    values = dequantize_kv(kv_cache[1][blocks].flatten(1, 2), kv_scales.v)
    group = num_heads // num_kv_heads
    qg = q.float().view(num_tokens, num_kv_heads, group, head_dim)
    scores = soft_cap(torch.einsum("thgd,tlhd->thgl", qg, keys) * scale, logit_softcap)  # [T, Hkv, G, L]
    key_pos = torch.arange(keys.shape[1], device=q.device)
    visible = key_pos[None, :] <= positions[:, None]  # [T, L]
    if sliding_window > 0:
        visible &= key_pos[None, :] > positions[:, None] - sliding_window
    scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
    out = torch.einsum("thgl,tlhd->thgd", scores.softmax(-1), values)
    return out.reshape(num_tokens, num_heads, head_dim)
