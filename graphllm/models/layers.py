"""Building blocks shared by the model families: RMSNorm, rotary embedding, paged attention."""

import math

import torch
from torch import nn

from graphllm.models.config import RopeConfig
from graphllm.ops.attention import AttentionMetadata
import graphllm.ops.attention  # noqa: F401  (registers torch.ops.graphllm.attention)


class RMSNorm(nn.Module):
    """Llama RMSNorm: normalise in float32, cast back, then scale (same order as transformers)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_inv_freq(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    """Inverse frequencies [head_dim // 2], with Llama 3's long-context rescaling, linear scaling or LongRoPE's
    per-frequency factors if asked."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    if rope.rope_type == "longrope":  # one product, then 1 / it: transformers' rounding
        return 1.0 / (torch.tensor(rope.ext_factors, dtype=torch.float32) * rope.theta ** exponents)
    inv_freq = 1.0 / rope.theta ** exponents
    if rope.rope_type == "default":
        return inv_freq
    if rope.rope_type == "linear":
        return inv_freq / rope.factor
    low_wavelen = rope.original_max_position_embeddings / rope.low_freq_factor
    high_wavelen = rope.original_max_position_embeddings / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (rope.original_max_position_embeddings / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """cos/sin for the given positions, computed in float32 like transformers does (LongRoPE: scaled by its
    attention factor before the cast)."""

    def __init__(self, rope: RopeConfig, head_dim: int):
        super().__init__()
        self.rope, self.head_dim = rope, head_dim
        self.register_buffer("inv_freq", rope_inv_freq(rope, head_dim), persistent=False)

    def reset_buffers(self, device: torch.device) -> None:
        """Recompute inv_freq on `device` (the model is built on the meta device)."""
        self.inv_freq = rope_inv_freq(self.rope, self.head_dim).to(device)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq[None, :]  # [T, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [T, D]
        cos, sin = emb.cos(), emb.sin()
        if self.rope.attention_factor != 1.0:
            cos, sin = cos * self.rope.attention_factor, sin * self.rope.attention_factor
        return cos.to(dtype), sin.to(dtype)


class PagedAttention(nn.Module):
    """Calls the attention op on layer `layer_idx`'s cache, meta.kv_caches[layer_idx]; no weights.

    Each layer has its own window (0: full), softmax scale (0: head_dim ** -0.5) and logit soft cap
    (0: off): Gemma alternates sliding-window and global layers and scales by query_pre_attn_scalar."""

    def __init__(self, layer_idx: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 sliding_window: int = 0, scale: float = 0.0, logit_softcap: float = 0.0):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = scale or head_dim ** -0.5
        self.sliding_window = sliding_window
        self.logit_softcap = logit_softcap

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        # q: [T, Hq, D]; k, v: [T, Hkv, D] -> [T, Hq, D]
        return torch.ops.graphllm.attention(
            q, k, v, meta.kv_caches[self.layer_idx], positions, meta.slot_mapping, meta.block_tables,
            meta.seq_lens, meta.query_start_loc, self.scale, self.sliding_window, self.logit_softcap)
