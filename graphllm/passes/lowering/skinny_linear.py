"""SkinnyLinear: every aten.linear of a GPU graph -> graphllm.linear, which runs small batches on
graphllm's skinny_matmul kernel and the rest on cuBLAS (see graphllm/ops/linear.py).

Before and after, for each linear of the step (qkv, o_proj, gate_up, down, lm_head):

    y: "bf16[T, N]" = aten.linear.default(x, weight)            # bias too, when there is one
    y: "bf16[T, N]" = graphllm.linear.default(x, weight)

Only graphs whose example inputs live on CUDA are rewritten (devices=("cuda",)): on CPU the op
would be F.linear behind an extern call, no faster than what Inductor already generates.
"""

from contextlib import nullcontext

import torch
from torch._guards import detect_fake_mode

import graphllm.ops.linear  # noqa: F401  (registers torch.ops.graphllm.linear)
from graphllm.ir.graph import StepGraph
from graphllm.passes.base import GraphPass

aten = torch.ops.aten
META_KEYS = ("nn_module_stack", "stack_trace")


def graph_device(graph: StepGraph) -> torch.device:
    return next(t.device for t in graph.example_inputs if isinstance(t, torch.Tensor))


class SkinnyLinear(GraphPass):
    """aten.linear -> graphllm.linear on the listed devices; counts {"replaced": linears}."""

    name = "skinny_linear"
    version = 1

    def __init__(self, devices: tuple[str, ...] = ("cuda",)):
        self.devices = devices

    def apply(self, graph: StepGraph) -> dict[str, int]:
        if graph_device(graph).type not in self.devices:
            return {"replaced": 0}
        replaced = 0
        for node in list(graph.graph.nodes):
            if node.op != "call_function" or node.target != aten.linear.default:
                continue
            with graph.graph.inserting_before(node):
                new = graph.graph.call_function(torch.ops.graphllm.linear.default, node.args, node.kwargs)
            new.meta.update({k: node.meta[k] for k in META_KEYS if k in node.meta})
            if isinstance(node.meta.get("val"), torch.Tensor):
                with detect_fake_mode([node.meta["val"]]) or nullcontext():
                    new.meta["val"] = node.meta["val"]
            node.replace_all_uses_with(new)
            graph.graph.erase_node(node)
            replaced += 1
        return {"replaced": replaced}
