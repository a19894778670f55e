"""SkinnyLinear: every aten.linear of a GPU graph -> graphllm.linear, which runs small batches on
graphllm's skinny_matmul kernel and the rest on cuBLAS (see graphllm/ops/linear.py).

Before and after, for each linear of the step (qkv, o_proj, gate_up, down, lm_head):

    y: "bf16[T, N]" = aten.linear.default(x, weight)            # bias too, when there is one
    y: "bf16[T, N]" = graphllm.linear.default(x, weight)

Only graphs whose example inputs live on CUDA are rewritten (`devices`, which the pass manager
reads): on CPU the op
would be F.linear behind an extern call, no faster than what Inductor already generates.
"""


import torch

import graphllm.ops.linear  # noqa: F401  (registers torch.ops.graphllm.linear)
from graphllm.ir.graph import StepGraph, copy_source_meta
from graphllm.passes.base import GraphPass

aten = torch.ops.aten


class SkinnyLinear(GraphPass):
    """aten.linear -> graphllm.linear on the listed devices; counts {"replaced": linears}."""

    name = "skinny_linear"
    version = 1

    devices = ("cuda",)

    def apply(self, graph: StepGraph) -> dict[str, int]:
        replaced = 0
        for node in list(graph.graph.nodes):
            if node.op != "call_function" or node.target != aten.linear.default:
                continue
            with graph.graph.inserting_before(node):
                new = graph.graph.call_function(torch.ops.graphllm.linear.default, node.args, node.kwargs)
            copy_source_meta(new, node)
            if "val" in node.meta:  # the same fake value: same shape, dtype and device
                new.meta["val"] = node.meta["val"]
            node.replace_all_uses_with(new)
            graph.graph.erase_node(node)
            replaced += 1
        return {"replaced": replaced}
