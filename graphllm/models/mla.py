"""DeepSeek-V2's multi-head latent attention (MLA), as transformers' modeling_deepseek_v2.py computes it, with the
cache holding the compressed latent instead of per-head K and V:

    q             = q_proj(x)  or  q_b_proj(q_a_layernorm(q_a_proj(x)))            # [T, H, nope + rope]
    c_kv, k_pe    = kv_a_proj_with_mqa(x) split [kv_lora_rank, rope]                 # one per token, no heads
    c_kv          = kv_a_layernorm(c_kv)
    q_pe, k_pe    = rope (interleaved pairs, as complex numbers: transformers' apply_rotary_emb)
    k_nope, v     = kv_b_proj(c_kv) per head [nope], [v_head_dim]                    # never materialised here

Absorbed (DeepSeek-V2 paper, appendix): q_nope . k_nope = (q_nope @ W_uk[h]) . c_kv, so the query goes through
kv_b_proj's key rows W_uk into the latent space and scores against the cached c_kv; the value read is the
latent, taken back to v_head_dim through the value rows W_uv after attention. graphllm.mla_attention
(graphllm/ops/mla_attention.py) writes [c_kv, k_pe] into the paged cache and attends. The softmax scale is
(nope + rope) ** -0.5, times yarn's mscale(factor, mscale_all_dim) squared; cos and sin carry yarn's attention
factor, as transformers does.
"""

import math

import torch
from torch import nn

import graphllm.ops.mla_attention  # noqa: F401  (registers torch.ops.graphllm.mla_attention)
from graphllm.models.config import ModelConfig, RopeConfig
from graphllm.models.layers import RMSNorm
from graphllm.ops.attention import AttentionMetadata


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def yarn_inv_freq(rope: RopeConfig, dim: int) -> torch.Tensor:
    """transformers' _compute_yarn_parameters inverse frequencies [dim // 2]: interpolated (/ factor) below the
    beta_slow..beta_fast correction range, the original ones above it, a linear ramp between."""
    def correction_dim(rotations: float) -> float:
        return dim * math.log(rope.original_max_position_embeddings / (rotations * 2 * math.pi)) / (2 * math.log(rope.theta))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    high = high + 0.001 if low == high else high
    pos_freqs = rope.theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    extrapolation = 1 - torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    return (1.0 / (rope.factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation


def rope_tables(rope: RopeConfig, dim: int) -> tuple[torch.Tensor, float]:
    """(inv_freq [dim // 2], the factor cos and sin are multiplied by) for default or yarn rope."""
    if rope.rope_type == "default":
        return 1.0 / rope.theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim), 1.0
    assert rope.rope_type == "yarn", f"MLA rope {rope.rope_type!r}"  # the registry refuses the others
    if rope.mscale and rope.mscale_all_dim:
        factor = yarn_mscale(rope.factor, rope.mscale) / yarn_mscale(rope.factor, rope.mscale_all_dim)
    else:
        factor = yarn_mscale(rope.factor)
    return yarn_inv_freq(rope, dim), factor


def mla_softmax_scale(config: ModelConfig) -> float:
    """(nope + rope) ** -0.5, times mscale(factor, mscale_all_dim) ** 2 under yarn (transformers' yarn_apply_mscale)."""
    scale = (config.qk_nope_head_dim + config.qk_rope_head_dim) ** -0.5
    if config.rope.rope_type != "default" and config.rope.mscale_all_dim:
        scale *= yarn_mscale(config.rope.factor, config.rope.mscale_all_dim) ** 2
    return scale


class LatentRotaryEmbedding(nn.Module):
    """cos, sin [T, rope // 2] in float32 for the interleaved rope of q_pe and k_pe (yarn's factor folded in)."""

    def __init__(self, rope: RopeConfig, dim: int):
        super().__init__()
        self.rope, self.dim = rope, dim
        inv_freq, self.attention_factor = rope_tables(rope, dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def reset_buffers(self, device: torch.device) -> None:
        """Recompute inv_freq on `device` (the model is built on the meta device)."""
        self.inv_freq = rope_tables(self.rope, self.dim)[0].to(device)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        # float32 whatever the model's dtype (rotate_interleaved rotates in float32)
        freqs = positions.float()[:, None] * self.inv_freq[None, :]  # [T, rope // 2]
        return freqs.cos() * self.attention_factor, freqs.sin() * self.attention_factor


def rotate_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, R] with pairs (0, 1), (2, 3), ... as complex numbers times e^(i freq); cos, sin [T, R // 2].
    In float32, cast back (transformers' apply_rotary_emb)."""
    pairs = x.float().unflatten(-1, (-1, 2))  # [T, H, R/2, 2]
    re, im = pairs[..., 0], pairs[..., 1]
    cos, sin = cos[:, None, :], sin[:, None, :]
    return torch.stack((re * cos - im * sin, re * sin + im * cos), dim=-1).flatten(-2).to(x.dtype)


class DeepseekV2Attention(nn.Module):
    """MLA over a latent paged cache; parameter names are the checkpoint's."""

    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        hidden, heads, bias = config.hidden_size, config.num_attention_heads, config.attention_bias
        self.layer_idx, self.num_heads = layer_idx, heads
        self.nope, self.rope, self.v_dim = config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim
        self.kv_lora_rank = config.kv_lora_rank
        q_dim = heads * (self.nope + self.rope)
        if config.q_lora_rank:
            self.q_a_proj = nn.Linear(hidden, config.q_lora_rank, bias=bias)
            self.q_a_layernorm = RMSNorm(config.q_lora_rank, 1e-6)  # transformers' default eps, not rms_norm_eps
            self.q_b_proj = nn.Linear(config.q_lora_rank, q_dim, bias=False)
        else:
            self.q_proj = nn.Linear(hidden, q_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(hidden, self.kv_lora_rank + self.rope, bias=bias)
        self.kv_a_layernorm = RMSNorm(self.kv_lora_rank, 1e-6)
        self.kv_b_proj = nn.Linear(self.kv_lora_rank, heads * (self.nope + self.v_dim), bias=False)
        self.o_proj = nn.Linear(heads * self.v_dim, hidden, bias=bias)
        self.scale = mla_softmax_scale(config)

    def project_q(self, x: torch.Tensor) -> torch.Tensor:
        if hasattr(self, "q_proj"):
            return self.q_proj(x)
        return self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        num_tokens = x.shape[0]
        q = self.project_q(x).view(num_tokens, self.num_heads, self.nope + self.rope)
        q_nope, q_pe = q.split([self.nope, self.rope], dim=-1)  # [T, H, nope], [T, H, rope]
        c_kv, k_pe = self.kv_a_proj_with_mqa(x).split([self.kv_lora_rank, self.rope], dim=-1)  # [T, L], [T, rope]
        c_kv = self.kv_a_layernorm(c_kv)
        q_pe = rotate_interleaved(q_pe, cos, sin)
        k_pe = rotate_interleaved(k_pe[:, None, :], cos, sin)[:, 0]
        w_kv = self.kv_b_proj.weight.view(self.num_heads, self.nope + self.v_dim, self.kv_lora_rank)
        w_uk, w_uv = w_kv[:, :self.nope], w_kv[:, self.nope:]  # [H, nope, L], [H, v, L]
        q_latent = torch.einsum("thn,hnl->thl", q_nope, w_uk)  # [T, H, L]: absorbed
        out = torch.ops.graphllm.mla_attention(
            torch.cat((q_latent, q_pe), dim=-1), torch.cat((c_kv, k_pe), dim=-1), meta.kv_caches[self.layer_idx],
            positions, meta.slot_mapping, meta.block_tables, meta.seq_lens, meta.query_start_loc, self.scale,
            self.kv_lora_rank)  # [T, H, L]
        out = torch.einsum("thl,hvl->thv", out, w_uv)  # [T, H, v]
        return self.o_proj(out.reshape(num_tokens, -1))
