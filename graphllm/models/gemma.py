"""Gemma 2 and Gemma 3 (text): the Llama blocks with Gemma's differences, as transformers' modeling_gemma2.py
and modeling_gemma3.py compute them. One module serves both; the differences are ModelConfig fields
(read by models/gemma_config.py):

- GemmaRMSNorm scales by (1 + weight), in float32, then casts. It is not a subclass of Llama's RMSNorm,
  so the fuse_add_rmsnorm pass (which matches RMSNorm modules) never takes it for Llama's norm.
- The embedding is multiplied by sqrt(hidden_size) rounded to the model's dtype (transformers casts the
  normalizer to the weight's dtype: sqrt(3584) = 59.87 is 60.0 in bfloat16).
- The MLP is GeGLU: gelu(gate, tanh approximation) * up. fuse_silu_mul matches silu only.
- Four norms per layer: input_layernorm before attention, post_attention_layernorm on its output before
  the residual add, pre_feedforward_layernorm before the MLP, post_feedforward_layernorm on its output.
- Attention is scaled by query_pre_attn_scalar ** -0.5; layers alternate sliding-window and global
  attention (config.layer_types), each layer's PagedAttention carrying its own window.
- Gemma 2: attention logits soft-capped inside the attention op (attn_logit_softcapping); logits of
  the lm_head soft-capped too (final_logit_softcapping), cap * tanh(x / cap).
- Gemma 3: per-head q/k norms (GemmaRMSNorm) before rope; the sliding layers rotate with their own rope
  (config.rope_local: rope_local_base_freq) and the global ones with config.rope (rope_theta, scaling).
The lm_head is tied to the embedding (Gemma's checkpoints store no lm_head). Parameter names are the
checkpoint's, so weights load without renaming.
"""

import torch
from torch import nn
import torch.nn.functional as F

from graphllm.kernels.reference import soft_cap
from graphllm.kernels.rotary import apply_rotary
from graphllm.models.config import ModelConfig
from graphllm.models.layers import RotaryEmbedding
from graphllm.models.llama import LlamaAttention, LlamaForCausalLM, LlamaMLP
from graphllm.ops.attention import AttentionMetadata

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class GemmaRMSNorm(nn.Module):
    """x / rms(x) * (1 + weight), all in float32, cast back to x's dtype (Gemma's order)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x * (1.0 + self.weight.float())).to(dtype)


class GemmaAttention(LlamaAttention):
    """Llama's attention; the config gives each layer its window, scale and soft cap (Gemma refuses a bias)."""
    qk_norm = GemmaRMSNorm  # Gemma 3


class GemmaMLP(LlamaMLP):
    """GeGLU: Llama's projections with tanh-approximated GELU in place of SiLU."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.gelu(self.gate_proj(x), approximate="tanh") * self.up_proj(x))


class GemmaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        self.sliding = config.window_of(layer_idx) > 0  # rotates with the local rope (Gemma 3)
        self.self_attn = GemmaAttention(config, layer_idx)
        self.mlp = GemmaMLP(config)
        norm = lambda: GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)  # noqa: E731
        self.input_layernorm, self.post_attention_layernorm = norm(), norm()
        self.pre_feedforward_layernorm, self.post_feedforward_layernorm = norm(), norm()

    def forward(self, x, cos, sin, positions, meta):
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), cos, sin, positions, meta))
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


def embedding_normalizers(hidden_size: int) -> dict[torch.dtype, float]:
    """sqrt(hidden_size) rounded to each float dtype, as transformers casts it (computed on the CPU at build
    time: the model is built on the meta device, and traced code must not make tensors of its own)."""
    return {dtype: torch.tensor(hidden_size ** 0.5, dtype=dtype, device="cpu").item() for dtype in FLOAT_DTYPES}


class GemmaModel(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.normalizers = embedding_normalizers(config.hidden_size)
        self.layers = nn.ModuleList(GemmaDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config.rope, config.head_dim)
        if config.rope_local is not None:
            self.rotary_emb_local = RotaryEmbedding(config.rope_local, config.head_dim)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        # input_ids, positions: [T] -> hidden states [T, hidden]
        x = self.embed_tokens(input_ids)
        x = x * self.normalizers[x.dtype]
        ropes = {False: self.rotary_emb(positions, x.dtype)}  # (cos, sin) [T, D] each
        ropes[True] = self.rotary_emb_local(positions, x.dtype) if hasattr(self, "rotary_emb_local") else ropes[False]
        for layer in self.layers:
            x = layer(x, *ropes[layer.sliding], positions, meta)
        return self.norm(x)


class GemmaForCausalLM(LlamaForCausalLM):
    """Gemma2ForCausalLM and Gemma3ForCausalLM (text only): see the module docstring."""

    def build_model(self, config: ModelConfig) -> nn.Module:
        return GemmaModel(config)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        # hidden: [N, hidden] (only the positions that sample) -> [N, vocab], soft-capped (Gemma 2)
        return soft_cap(self.lm_head(hidden), self.config.final_logit_softcapping)
