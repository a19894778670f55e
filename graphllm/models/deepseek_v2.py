"""DeepSeek-V2 and V2-Lite (DeepseekV2ForCausalLM), as transformers' modeling_deepseek_v2.py computes them:
Llama's pre-norm blocks with multi-head latent attention (graphllm/models/mla.py: the cache holds the compressed
latent) and, from layer first_k_dense_replace on (every moe_layer_freq-th layer: ModelConfig.sparse_layers),
a mixture of experts with shared experts in place of the dense MLP:

    out = routed_scaling_factor * graphllm.fused_moe(x, gate(x), experts, top_k, renormalize=False)
          + shared_experts(x)                      # one MLP of n_shared_experts * moe_intermediate_size

Routing is softmax scoring with greedy top-k, the weights as the softmax gives them (transformers' DeepseekV2
router; the registry refuses the other topk methods, scoring functions and norm_topk_prob). The experts are named
`mlp.experts.{e}.gate_proj/up_proj/down_proj` in the checkpoint and stacked on load (models/moe.py), the router
`mlp.gate`.
"""

import torch
from torch import nn
import torch.nn.functional as F

import graphllm.ops.moe  # noqa: F401  (registers torch.ops.graphllm.fused_moe)
from graphllm.models.config import ModelConfig
from graphllm.models.llama import LlamaDecoderLayer, LlamaForCausalLM, LlamaModel
from graphllm.models.mla import DeepseekV2Attention, LatentRotaryEmbedding
from graphllm.models.moe import MoeExperts

EXPERT_NAMES = ("gate_proj", "up_proj", "down_proj")


class DeepseekV2MLP(nn.Module):
    """SwiGLU of the given intermediate size (the dense layers' and the shared experts')."""

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DeepseekV2MoE(nn.Module):
    """Routed experts through graphllm.fused_moe, scaled, plus the shared experts; forward(x [T, H]) -> [T, H]."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.top_k, self.routed_scaling_factor = config.num_experts_per_tok, config.routed_scaling_factor
        self.gate = nn.Linear(config.hidden_size, config.num_experts, bias=False)
        self.experts = MoeExperts(config.num_experts, config.hidden_size, config.moe_intermediate_size, EXPERT_NAMES)
        self.shared_experts = DeepseekV2MLP(config.hidden_size, config.n_shared_experts * config.moe_intermediate_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        routed = torch.ops.graphllm.fused_moe(x, self.gate(x), self.experts.gate_up_proj, self.experts.down_proj,
                                              self.top_k, False)
        if self.routed_scaling_factor != 1.0:
            routed = routed * self.routed_scaling_factor
        return routed + self.shared_experts(x)


class DeepseekV2DecoderLayer(LlamaDecoderLayer):
    attention = DeepseekV2Attention

    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__(config, layer_idx)  # Llama's norms; its dense MLP replaced before any weight is read
        sparse = layer_idx in config.sparse_layers
        self.mlp = DeepseekV2MoE(config) if sparse else DeepseekV2MLP(config.hidden_size, config.intermediate_size)


class DeepseekV2ForCausalLM(LlamaForCausalLM):
    decoder_layer = DeepseekV2DecoderLayer

    def build_model(self, config: ModelConfig) -> nn.Module:
        # the decoupled rope of q_pe and k_pe: qk_rope_head_dim wide, interleaved, yarn, cos/sin in float32
        return LlamaModel(config, self.decoder_layer, self.norm,
                          rotary=lambda config: LatentRotaryEmbedding(config.rope, config.qk_rope_head_dim))
