"""The Llama family: Llama 2/3, Mistral (sliding window), Qwen2 (q/k/v bias), Qwen3 (q/k norm).

Reads like transformers' modeling_llama.py; parameter names match the Hugging Face checkpoint
names so weights load without renaming. The only departures: tokens are flat ([T] instead of
[B, S]) and attention goes through torch.ops.graphllm.attention with the step's metadata.
"""

import torch
from torch import nn
import torch.nn.functional as F

from graphllm.models.config import ModelConfig
from graphllm.models.layers import PagedAttention, RMSNorm, RotaryEmbedding
from graphllm.ops.attention import AttentionMetadata
from graphllm.kernels.rotary import apply_rotary


class LlamaAttention(nn.Module):
    qk_norm: type[nn.Module] = RMSNorm  # Qwen3's per-head q/k norms (Gemma 3 names its own)

    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        hidden, heads, kv_heads = config.hidden_size, config.num_attention_heads, config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_proj = nn.Linear(hidden, heads * self.head_dim, bias=config.attention_bias)
        self.k_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=config.attention_bias)
        self.v_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=config.attention_bias)
        self.o_proj = nn.Linear(heads * self.head_dim, hidden, bias=False)
        if config.qk_norm:
            self.q_norm = self.qk_norm(self.head_dim, config.rms_norm_eps)
            self.k_norm = self.qk_norm(self.head_dim, config.rms_norm_eps)
        self.attn = PagedAttention(layer_idx, heads, kv_heads, self.head_dim, config.window_of(layer_idx),
                                   config.attention_scale, config.attn_logit_softcapping)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        num_tokens = x.shape[0]
        q = self.q_proj(x).view(num_tokens, -1, self.head_dim)  # [T, Hq, D]
        k = self.k_proj(x).view(num_tokens, -1, self.head_dim)  # [T, Hkv, D]
        v = self.v_proj(x).view(num_tokens, -1, self.head_dim)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        out = self.attn(q, k, v, positions, meta)  # [T, Hq, D]
        return self.o_proj(out.reshape(num_tokens, -1))


class LlamaMLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    attention: type[nn.Module] = LlamaAttention  # a family with other blocks (models/phi3.py) names its own
    feed_forward: type[nn.Module] = LlamaMLP

    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        self.self_attn = self.attention(config, layer_idx)
        self.mlp = self.feed_forward(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, cos, sin, positions, meta):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, positions, meta)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    """rotary_emb(positions, dtype) -> cos, sin for every layer; `rotary` builds it (DeepSeek-V2: its own)."""

    def __init__(self, config: ModelConfig, decoder_layer: type[nn.Module] = LlamaDecoderLayer,
                 norm: type[nn.Module] = RMSNorm, rotary=lambda config: RotaryEmbedding(config.rope, config.head_dim)):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(decoder_layer(config, i) for i in range(config.num_hidden_layers))
        self.norm = norm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = rotary(config)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        # input_ids, positions: [T] -> hidden states [T, hidden]
        x = self.embed_tokens(input_ids)
        cos, sin = self.rotary_emb(positions, x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin, positions, meta)
        return self.norm(x)


class LlamaForCausalLM(nn.Module):
    """Also serves Mistral, Qwen2 and Qwen3: their differences are flags in ModelConfig. A family that
    changes the layer or the norm (models/olmo2.py) subclasses it and names its own."""

    decoder_layer: type[nn.Module] = LlamaDecoderLayer
    norm: type[nn.Module] = RMSNorm

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model = self.build_model(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def build_model(self, config: ModelConfig) -> nn.Module:
        """The decoder stack under `model` (models/gemma.py builds its own)."""
        return LlamaModel(config, self.decoder_layer, self.norm)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        return self.model(input_ids, positions, meta)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        # hidden: [N, hidden] (only the positions that sample) -> [N, vocab]
        return self.lm_head(hidden)
