"""OLMo 2: the Llama blocks with two changes, as transformers' modeling_olmo2.py has them.

- The norms come after attention and after the MLP, on their outputs, before each residual add
  (post_attention_layernorm, post_feedforward_layernorm); there is no norm before either.
- q_norm and k_norm are RMSNorms over the whole q and k projections (all heads at once), applied
  before the heads are split and rope turns them.

Its RMSNorm scales in float32 and then casts (Llama's casts, then scales). Parameter names are the
checkpoint's, so weights load without renaming.
"""

import torch
from torch import nn

from graphllm.kernels.rotary import apply_rotary
from graphllm.models.config import ModelConfig
from graphllm.models.layers import RMSNorm
from graphllm.models.llama import LlamaAttention, LlamaForCausalLM, LlamaMLP
from graphllm.ops.attention import AttentionMetadata


class Olmo2RMSNorm(RMSNorm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * x).to(dtype)


class Olmo2Attention(LlamaAttention):
    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__(config, layer_idx)  # the projections and the paged attention (no bias: registry)
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.q_norm = Olmo2RMSNorm(heads * self.head_dim, config.rms_norm_eps)  # over all heads at once
        self.k_norm = Olmo2RMSNorm(kv_heads * self.head_dim, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        num_tokens = x.shape[0]
        q = self.q_norm(self.q_proj(x)).view(num_tokens, -1, self.head_dim)  # [T, Hq, D]
        k = self.k_norm(self.k_proj(x)).view(num_tokens, -1, self.head_dim)  # [T, Hkv, D]
        v = self.v_proj(x).view(num_tokens, -1, self.head_dim)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        out = self.attn(q, k, v, positions, meta)  # [T, Hq, D]
        return self.o_proj(out.reshape(num_tokens, -1))


class Olmo2DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        self.self_attn = Olmo2Attention(config, layer_idx)
        self.mlp = LlamaMLP(config)
        self.post_attention_layernorm = Olmo2RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_feedforward_layernorm = Olmo2RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, cos, sin, positions, meta):
        x = x + self.post_attention_layernorm(self.self_attn(x, cos, sin, positions, meta))
        return x + self.post_feedforward_layernorm(self.mlp(x))


class Olmo2ForCausalLM(LlamaForCausalLM):
    decoder_layer = Olmo2DecoderLayer
    norm = Olmo2RMSNorm
