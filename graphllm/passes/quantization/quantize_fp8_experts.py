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
its own rows.

With `checkpoint` (a pre-quantized FP8 checkpoint's expert stacks, unpacked by the loader:
graphllm/models/quantization/experts.py; {"model.layers.3.mlp.experts.gate_up_proj": {"qweight", "weight_scale"},
...}) its float8 stacks and scales are used as they are, nothing is quantized here, and exactly the layers it
has are rewritten: a layer whose experts the checkpoint keeps float stays graphllm.fused_moe (logged).
"""

import logging
from collections.abc import Mapping

import torch
from torch import fx

import graphllm.ops.moe  # noqa: F401  (registers graphllm.fused_moe / fused_moe_fp8)
from graphllm.ir.graph import StepGraph, attr_tensor, new_node
from graphllm.kernels.fused_moe_reference import quantize_fp8_experts
from graphllm.kernels.quant_layout import FP8_DTYPE
from graphllm.passes.base import GraphPass
from graphllm.passes.quantization.quantize_linears import STEP_PREFIX

ops = torch.ops.graphllm
log = logging.getLogger(__name__)
Checkpoint = Mapping[str, Mapping[str, torch.Tensor]]


class QuantizeFP8Experts(GraphPass):
    """graphllm.fused_moe -> graphllm.fused_moe_fp8 over float8 experts; counts {"moe_layers": n}."""

    name = "quantize_fp8_experts"
    version = 2

    def __init__(self, checkpoint: Checkpoint | None = None):
        self.checkpoint = checkpoint

    def apply(self, graph: StepGraph) -> dict[str, int]:
        layers = [n for n in graph.graph.nodes if n.op == "call_function" and n.target == ops.fused_moe.default]
        rewritten, found = 0, set()
        for node in layers:
            x, logits, w13, w2, top_k, renormalize = node.args
            stacks = [_expert_stack(graph, attr, node) for attr in (w13, w2)]
            if self.checkpoint is None:
                quantized = [quantize_fp8_experts(stack.detach()) for stack in stacks]
            else:
                quantized = _checkpoint_stacks(self.checkpoint, (w13, w2), stacks, node)
                if quantized is None:
                    continue
                found.update(_stack_name(attr) for attr in (w13, w2))
            with graph.graph.inserting_before(node):
                operands = [graph.add_weight(f"{attr.target}_{key}", tensor, node)
                            for attr, (qweight, scale) in zip((w13, w2), quantized)
                            for key, tensor in (("qweight", qweight), ("weight_scale", scale))]
                new = new_node(graph.graph, ops.fused_moe_fp8.default, (x, logits, *operands, top_k, renormalize),
                               node)
            if "val" in node.meta:  # the same output as the node it replaces (the weights' get_attrs have none)
                new.meta["val"] = node.meta["val"]
            node.replace_all_uses_with(new)
            graph.graph.erase_node(node)
            rewritten += 1
        if self.checkpoint is not None and set(self.checkpoint) - found:
            raise ValueError("quantize_fp8_experts: the checkpoint has float8 experts the model graph does not have: "
                             + ", ".join(sorted(set(self.checkpoint) - found)[:4]))
        if rewritten:
            graph.drop_unused_weights()
        return {"moe_layers": rewritten}


def _expert_stack(graph: StepGraph, attr: fx.Node, like: fx.Node) -> torch.Tensor:
    if attr.op != "get_attr":
        raise ValueError(f"quantize_fp8_experts: {like.name} reads its experts from {attr.name}, not a weight")
    return attr_tensor(graph.gm, attr)


def _stack_name(attr: fx.Node) -> str:
    """The stack's path in the model (the checkpoint's key): get_attr model.<path> -> <path>."""
    return attr.target.removeprefix(STEP_PREFIX)


def _checkpoint_stacks(checkpoint: Checkpoint, attrs: tuple[fx.Node, fx.Node], stacks: list[torch.Tensor],
                       like: fx.Node) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
    """[(qweight, scale) of w13, of w2] from the checkpoint, checked against the float stacks' shapes; None when
    it holds neither (the layer stays float)."""
    names = [_stack_name(attr) for attr in attrs]
    held = [name in checkpoint for name in names]
    if not any(held):
        log.info("%s stays %s: the checkpoint keeps its experts unquantized", names[0].rpartition(".")[0],
                 str(stacks[0].dtype).removeprefix("torch."))
        return None
    if not all(held):
        missing = names[held.index(False)]
        raise ValueError(f"quantize_fp8_experts: the checkpoint has float8 experts for {names[held.index(True)]} "
                         f"but not {missing}, both operands of {like.name}")
    out = []
    for name, stack in zip(names, stacks):
        qweight, scale = checkpoint[name]["qweight"], checkpoint[name]["weight_scale"]
        if (qweight.dtype, qweight.shape, scale.dtype, scale.shape) != (FP8_DTYPE, stack.shape, torch.float32,
                                                                        stack.shape[:2]):
            raise ValueError(f"quantize_fp8_experts: the checkpoint's {name} is {qweight.dtype} "
                             f"{tuple(qweight.shape)} with scales {scale.dtype} {tuple(scale.shape)}; the graph "
                             f"needs float8_e4m3fn {tuple(stack.shape)} with float32 {tuple(stack.shape[:2])}")
        out.append((qweight, scale))
    return out
