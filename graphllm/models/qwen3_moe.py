"""Qwen3-MoE: Qwen3's attention (per-head q/k norms: ModelConfig.qk_norm) with a sparse mixture of experts
as the MLP of the layers ModelConfig.sparse_layers lists, as transformers' modeling_qwen3_moe.py has it:
layer i is sparse unless it is in `mlp_only_layers` or (i + 1) is not a multiple of `decoder_sparse_step`
(the registry turns those into sparse_layers); the others keep the dense Llama MLP of `intermediate_size`.
Experts use `moe_intermediate_size`; the checkpoint names them `mlp.experts.{e}.gate_proj/up_proj/down_proj`
and the router `mlp.gate`. The top-k weights are renormalised when `norm_topk_prob` is set.
"""

from graphllm.models.config import ModelConfig
from graphllm.models.llama import LlamaDecoderLayer, LlamaForCausalLM
from graphllm.models.moe import SparseMoeBlock

EXPERT_NAMES = ("gate_proj", "up_proj", "down_proj")


class Qwen3MoeDecoderLayer(LlamaDecoderLayer):
    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__(config, layer_idx)  # Llama's attention, norms and dense MLP
        if layer_idx in config.sparse_layers:
            self.mlp = SparseMoeBlock(config, EXPERT_NAMES)  # replaces the dense MLP before any weight is read


class Qwen3MoeForCausalLM(LlamaForCausalLM):
    decoder_layer = Qwen3MoeDecoderLayer
