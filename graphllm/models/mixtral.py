"""Mixtral: the Llama blocks (and Mistral's sliding window) with every layer's MLP a sparse mixture of
experts, `block_sparse_moe`, as the published checkpoints name it (transformers 5 calls the module `mlp`
in memory but saves this layout): the router `block_sparse_moe.gate` and per expert
`block_sparse_moe.experts.{e}.w1` (gate), `w3` (up), `w2` (down), stacked on load (models/moe.py). The
top-k routing weights are always renormalised.
"""

import torch
from torch import nn

from graphllm.models.config import ModelConfig
from graphllm.models.layers import RMSNorm
from graphllm.models.llama import LlamaAttention, LlamaForCausalLM
from graphllm.models.moe import SparseMoeBlock
from graphllm.ops.attention import AttentionMetadata

EXPERT_NAMES = ("w1", "w3", "w2")  # gate, up, down


class MixtralDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        self.self_attn = LlamaAttention(config, layer_idx)
        self.block_sparse_moe = SparseMoeBlock(config, EXPERT_NAMES)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, positions, meta)
        return x + self.block_sparse_moe(self.post_attention_layernorm(x))


class MixtralForCausalLM(LlamaForCausalLM):
    decoder_layer = MixtralDecoderLayer
