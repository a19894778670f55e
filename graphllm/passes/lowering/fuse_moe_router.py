"""FuseMoeRouter: a MoE layer's router linear moves into its experts' op, so one token routes in one launch.

At batch 1 a sparse layer runs the router's GEMV (graphllm.linear over [E, H]) and then fused_moe's routing kernel
before its experts: two launches for half a megabyte. With the linear inside the op, fused_moe_routed runs both as
one kernel for one token (graphllm/kernels/moe_router.py) and as before for more:

    logits: "bf16[T, E]" = graphllm.linear.default(x, w_router)
    y:      "bf16[T, H]" = graphllm.fused_moe.default(x, logits, w13, w2, k, renormalize)
->
    y:      "bf16[T, H]" = graphllm.fused_moe_routed.default(x, w_router, w13, w2, k, renormalize)

Only a linear without bias whose one reader is the fused_moe it routes, over the experts' own input, is taken
(Qwen3-MoE, Mixtral, DeepSeek-V2's routed experts). fused_moe_fp8 (--quantization fp8 experts) is left as it is,
and so is a router that shared_norm_prologue has already fused with its norm. Runs after skinny_linear (which
makes the graphllm.linear), on GPU graphs. Off by default (`CompileConfig.fuse_moe_router`,
`--fuse-moe-router`) until a GPU A/B says it pays.
"""

import torch
from torch import fx

import graphllm.ops.linear  # noqa: F401  (registers graphllm.linear)
import graphllm.ops.moe  # noqa: F401  (registers fused_moe_routed)
from graphllm.ir.graph import StepGraph, new_node
from graphllm.passes.base import GraphPass
from graphllm.passes.lowering.linear_prologue import _call

ops = torch.ops.graphllm


def _fold(graph: fx.Graph, moe: fx.Node) -> bool:
    x, logits, *rest = moe.args
    if not _call(logits, ops.linear.default) or len(logits.users) != 1:
        return False
    lin_x, w_router, *bias = logits.args
    if lin_x is not x or any(b is not None for b in bias):
        return False
    with graph.inserting_before(moe):
        fused = new_node(graph, ops.fused_moe_routed.default, (x, w_router, *rest), moe)
    moe.replace_all_uses_with(fused)
    graph.erase_node(moe)
    graph.erase_node(logits)
    return True


class FuseMoeRouter(GraphPass):
    """Each fused_moe whose router logits come from a graphllm.linear of its input -> fused_moe_routed (module
    docstring); counts the layers rewritten."""

    name = "fuse_moe_router"
    version = 1

    devices = ("cuda",)

    def apply(self, graph: StepGraph) -> dict[str, int]:
        g = graph.graph
        moes = [n for n in g.nodes if _call(n, ops.fused_moe.default)]
        return {"moe_layers": sum(_fold(g, n) for n in moes)}
