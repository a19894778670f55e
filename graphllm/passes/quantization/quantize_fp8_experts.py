"""QuantizeFP8Experts: each mixture-of-experts layer's stacked experts -> float8 (weight-only, one scale per
output row of each expert), the fused MoE op -> its float8 twin. The router stays in the model dtype.

Per MoE layer (<e> = its experts module, e.g. model.layers.3.block_sparse_moe.experts):

    before
        w13: "bf16[E, 2I, H]" = get_attr <e>.gate_up_proj
        w2:  "bf16[E, H, I]"  = get_attr <e>.down_proj
        y:   "bf16[T, H]"     = graphllm.fused_moe.default(x, logits, w13, w2, k, renormalize)
    after
        q13: "f8e4m3fn[E, 2I, H]" = get_attr <e>.gate_up_proj_qweight
        s13: "f32[E, 2I]"         = get_attr <e>.gate_up_proj_weight_scale      # max|row| / 448
        q2:  "f8e4m3fn[E, H, I]"  = get_attr <e>.down_proj_qweight
        s2:  "f32[E, H]"          = get_attr <e>.down_proj_weight_scale
        y:   "bf16[T, H]"         = graphllm.fused_moe_fp8.default(x, logits, q13, s13, q2, s2, k, renormalize)

The float experts leave the graph's weights (the artifact stores the float8 ones), and the op computes
fused_moe over the dequantized experts (graphllm/ops/moe.py). Activations are not quantized: MoE decode is
bound by reading the chosen experts' weights, which this halves. Runs with --quantization fp8 beside
QuantizeFP8 (the dense linears), after shard_tp, which splits the float experts first: each rank quantizes
its own rows. Pre-quantized MoE checkpoints are refused before this (models/registry.py).
"""

import torch
from torch import fx

import graphllm.ops.moe  # noqa: F401  (registers graphllm.fused_moe / fused_moe_fp8)
from graphllm.ir.graph import StepGraph, attr_tensor, new_node
from graphllm.kernels.fused_moe_reference import quantize_fp8_experts
from graphllm.passes.base import GraphPass

ops = torch.ops.graphllm


class QuantizeFP8Experts(GraphPass):
    """graphllm.fused_moe -> graphllm.fused_moe_fp8 over float8 experts; counts {"moe_layers": n}."""

    name = "quantize_fp8_experts"
    version = 1

    def apply(self, graph: StepGraph) -> dict[str, int]:
        layers = [n for n in graph.graph.nodes if n.op == "call_function" and n.target == ops.fused_moe.default]
        for node in layers:
            x, logits, w13, w2, top_k, renormalize = node.args
            with graph.graph.inserting_before(node):
                quantized = (*_fp8_experts(graph, w13, node), *_fp8_experts(graph, w2, node))
                new = new_node(graph.graph, ops.fused_moe_fp8.default, (x, logits, *quantized, top_k, renormalize),
                               node)
            if "val" in node.meta:  # the same output as the node it replaces (the weights' get_attrs have none)
                new.meta["val"] = node.meta["val"]
            node.replace_all_uses_with(new)
            graph.graph.erase_node(node)
        if layers:
            graph.drop_unused_weights()
        return {"moe_layers": len(layers)}


def _fp8_experts(graph: StepGraph, attr: fx.Node, like: fx.Node) -> tuple[fx.Node, fx.Node]:
    """get_attr nodes of the float8 experts and their scales, quantized from the stack `attr` reads."""
    if attr.op != "get_attr":
        raise ValueError(f"quantize_fp8_experts: {like.name} reads its experts from {attr.name}, not a weight")
    qweight, scale = quantize_fp8_experts(attr_tensor(graph.gm, attr).detach())
    return (graph.add_weight(f"{attr.target}_qweight", qweight, like),
            graph.add_weight(f"{attr.target}_weight_scale", scale, like))
