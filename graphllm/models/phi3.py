"""Phi-3: the Llama blocks with q/k/v in one projection (qkv_proj) and gate/up in one (gate_up_proj), as
the checkpoint stores them and transformers' modeling_phi3.py computes them: the module keeps them fused
and splits their outputs (q, k, v by head counts; gate then up by halves), so the weights load as
published and the compiler's fusions have nothing left to fuse there.

Supported: the default rope, a sliding window (Phi-3-mini-4k's 2047) and LongRoPE ("longrope", first named
"su": the 128k models), whose long or short factors serve every position, chosen once from the engine's
max_model_len as vLLM does (models/config.fit_max_model_len; transformers chooses per call from the longest
position, so the two agree while a sequence stays within original_max_position_embeddings or starts past it).
Refused by name: a partial rotary factor (Phi-3.5, Phi-4-mini) and malformed longrope fields.
"""

import torch
from torch import nn
import torch.nn.functional as F

from graphllm.kernels.rotary import apply_rotary
from graphllm.models.config import ModelConfig
from graphllm.models.layers import PagedAttention
from graphllm.models.llama import LlamaDecoderLayer, LlamaForCausalLM
from graphllm.ops.attention import AttentionMetadata


class Phi3Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        heads, kv_heads, d = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        self.head_dim, self.q_size, self.kv_size = d, heads * d, kv_heads * d
        self.qkv_proj = nn.Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=False)
        self.o_proj = nn.Linear(heads * d, config.hidden_size, bias=False)
        self.attn = PagedAttention(layer_idx, heads, kv_heads, d, config.sliding_window)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        num_tokens = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.reshape(num_tokens, -1, self.head_dim)  # [T, Hq, D]
        k = k.reshape(num_tokens, -1, self.head_dim)  # [T, Hkv, D]
        v = v.reshape(num_tokens, -1, self.head_dim)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        out = self.attn(q, k, v, positions, meta)  # [T, Hq, D]
        return self.o_proj(out.reshape(num_tokens, -1))


class Phi3MLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.intermediate = config.intermediate_size
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # split with sizes (transformers chunks: the same halves): the shape FuseSiluMul reads
        gate, up = self.gate_up_proj(x).split([self.intermediate, self.intermediate], dim=-1)
        return self.down_proj(up * F.silu(gate))


class Phi3DecoderLayer(LlamaDecoderLayer):
    attention = Phi3Attention
    feed_forward = Phi3MLP


class Phi3ForCausalLM(LlamaForCausalLM):
    decoder_layer = Phi3DecoderLayer
