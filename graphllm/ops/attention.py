"""Paged attention with the KV-cache write, as one registered custom op.

`torch.ops.graphllm.attention` is the only place where a model touches batching or the KV
cache. Tracing (torch.compile, torch.export) sees it as one opaque node thanks to the fake
implementation below; the runtime chooses the backend (graphllm/ops/backends: torch, triton,
flashinfer). This file holds the PyTorch reference over the pages, used on CPU and as the
oracle for GPU kernels.

Step metadata is flat tensors (see DESIGN.md, "Step inputs are flat tensors"):
  slot_mapping[T]       cache slot (block * block_size + offset) of each new token
  block_tables[B, M]    block ids of each sequence (padded with 0 past its last block)
  seq_lens[B]           tokens in cache after this step, per sequence
  query_start_loc[B+1]  token offsets of each sequence's new tokens in the flat batch
  kv_caches[L]          one [2, num_blocks, block_size, Hkv, D] tensor per layer, written in place
The token positions come from the model (`positions[T]`); token t may attend to cached
tokens 0..positions[t] of its own sequence.

The cache's element type is the model's dtype, or float8_e4m3fn (EngineConfig.kv_cache_dtype
"fp8"): then K and V are stored as saturate(x / scale) and read as stored * scale, with the
per-tensor KVScales the runtime hands the backend (graphllm/ops/kv_quant.py). Neither the scales
nor the element type are in the op's signature, so one compiled graph serves every cache dtype.
"""

from typing import NamedTuple

import torch

from graphllm.ops.backends import active_backend
from graphllm.ops.kv_quant import KVScales, dequantize_kv, is_fp8, quantize_kv


class AttentionMetadata(NamedTuple):
    """The flat per-step tensors that the attention op reads (shapes in the module docstring)."""

    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    kv_caches: list[torch.Tensor]


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


def reference_attention(q: torch.Tensor, kv_cache: torch.Tensor, positions: torch.Tensor,
                        block_tables: torch.Tensor, query_start_loc: torch.Tensor,
                        scale: float, sliding_window: int, kv_scales: KVScales = KVScales()) -> torch.Tensor:
    """Causal attention of every new token over its sequence's pages, in float32.

    q: [T, Hq, D]; returns [T, Hq, D]. Materialises [T, L, Hkv, D] keys (L = M * block_size):
    meant for small CPU batches and tests, not for speed. kv_scales: read a float8 cache with them.
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
    scores = torch.einsum("thgd,tlhd->thgl", qg, keys) * scale  # [T, Hkv, G, L]
    key_pos = torch.arange(keys.shape[1], device=q.device)
    visible = key_pos[None, :] <= positions[:, None]  # [T, L]
    if sliding_window > 0:
        visible &= key_pos[None, :] > positions[:, None] - sliding_window
    scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
    out = torch.einsum("thgl,tlhd->thgd", scores.softmax(-1), values)
    return out.reshape(num_tokens, num_heads, head_dim)


@torch.library.custom_op("graphllm::attention", mutates_args=("kv_cache",))
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
              positions: torch.Tensor, slot_mapping: torch.Tensor, block_tables: torch.Tensor,
              seq_lens: torch.Tensor, query_start_loc: torch.Tensor, scale: float,
              sliding_window: int) -> torch.Tensor:
    """Write k/v ([T, Hkv, D]) into kv_cache at slot_mapping, then attend q ([T, Hq, D]).

    Returns [T, Hq, D] in q's dtype. sliding_window <= 0 means full attention; otherwise token
    at position p sees keys at positions p - sliding_window + 1 .. p (Mistral's convention).
    """
    return active_backend().forward(q, k, v, kv_cache, positions, slot_mapping, block_tables, seq_lens,
                                    query_start_loc, scale, sliding_window)


@attention.register_fake
def _(q, k, v, kv_cache, positions, slot_mapping, block_tables, seq_lens, query_start_loc,
      scale, sliding_window):
    return torch.empty_like(q)


@torch.library.custom_op("graphllm::rope_attention", mutates_args=("kv_cache",))
def rope_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   kv_cache: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor,
                   block_tables: torch.Tensor, seq_lens: torch.Tensor, query_start_loc: torch.Tensor,
                   scale: float, sliding_window: int) -> torch.Tensor:
    """attention(apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v, ...), cos and sin [T, D].

    What the fuse_rope_attention pass puts in place of a layer's rotary embedding and attention
    op, so that a backend can rotate q and k inside its KV-cache write (one kernel instead of
    three). Returns [T, Hq, D], contiguous, in q's dtype.
    """
    return active_backend().rope_forward(q, k, v, cos, sin, kv_cache, positions, slot_mapping, block_tables,
                                         seq_lens, query_start_loc, scale, sliding_window)


@rope_attention.register_fake
def _(q, k, v, cos, sin, kv_cache, positions, slot_mapping, block_tables, seq_lens, query_start_loc,
      scale, sliding_window):
    return q.new_empty(q.shape)
