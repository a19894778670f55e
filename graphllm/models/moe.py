"""The sparse mixture-of-experts feed-forward that Mixtral and Qwen3-MoE share (models/mixtral.py,
models/qwen3_moe.py), as transformers 5's MixtralSparseMoeBlock / Qwen3MoeSparseMoeBlock compute it:

    router_logits = gate(x)                                        # [T, E], nn.Linear without bias
    out = graphllm.fused_moe(x, router_logits, experts.gate_up_proj, experts.down_proj, top_k, renormalize)

The experts are stacked parameters, gate_up_proj [E, 2I, H] (each expert's gate rows, then its up rows) and
down_proj [E, H, I]: transformers 5's own names and layout, and fused_moe's operands. The published
checkpoints store one linear per expert and projection (`experts.{e}.{gate}.weight` ...); checkpoint_parts
tells the loader where each lands. The forward has no data-dependent control flow: routing happens inside
the op, so the captured graph holds one fused_moe node per sparse layer.
"""

import torch
from torch import nn

import graphllm.ops.moe  # noqa: F401  (registers torch.ops.graphllm.fused_moe)
from graphllm.models.checkpoint_parts import CheckpointPart
from graphllm.models.config import ModelConfig


class MoeExperts(nn.Module):
    """E SwiGLU experts stacked. `names`: the checkpoint's per-expert (gate, up, down) linear names."""

    def __init__(self, num_experts: int, hidden: int, intermediate: int, names: tuple[str, str, str]):
        super().__init__()
        self.num_experts, self.intermediate, self.names = num_experts, intermediate, names
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate, hidden))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, intermediate))

    def checkpoint_parts(self, prefix: str) -> dict[str, CheckpointPart]:
        """{"<prefix>.{e}.<gate>.weight": gate_up_proj[e, :I], "...<up>...": [e, I:], "...<down>...": down_proj[e]}."""
        gate, up, down = self.names
        size, parts = self.intermediate, {}
        for e in range(self.num_experts):
            parts[f"{prefix}.{e}.{gate}.weight"] = CheckpointPart(f"{prefix}.gate_up_proj", (e, slice(0, size)))
            parts[f"{prefix}.{e}.{up}.weight"] = CheckpointPart(f"{prefix}.gate_up_proj", (e, slice(size, 2 * size)))
            parts[f"{prefix}.{e}.{down}.weight"] = CheckpointPart(f"{prefix}.down_proj", (e,))
        return parts


class SparseMoeBlock(nn.Module):
    """The router and the experts; forward(x [T, H]) -> [T, H]."""

    def __init__(self, config: ModelConfig, expert_names: tuple[str, str, str]):
        super().__init__()
        self.top_k, self.renormalize = config.num_experts_per_tok, config.norm_topk_prob
        self.gate = nn.Linear(config.hidden_size, config.num_experts, bias=False)
        self.experts = MoeExperts(config.num_experts, config.hidden_size, config.moe_intermediate_size, expert_names)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        router_logits = self.gate(x)  # [T, E]
        return torch.ops.graphllm.fused_moe(x, router_logits, self.experts.gate_up_proj, self.experts.down_proj,
                                            self.top_k, self.renormalize)
