"""PrefetchOProj: each attention op gets the weight of the linear that reads its output (o_proj) as its prefetch hint.

At decode, a layer's attention reads a few MB of KV cache while the HBM could stream ten times that, and the
output projection right after it streams its whole weight (33.5 MB at the 8B shape in bf16) from HBM. With the
hint the triton backend's decode kernel fetches that weight into L2 as it starts (one bulk prefetch a program:
kernels/paged_decode_attention.py), so that o_proj reads it from L2. The hint changes no value. Before and after,
for one layer (the linear may be graphllm.linear, aten.linear, or a quantized linear with its activation
quantization between):

    a = graphllm.rope_attention.default(q, k, v, cos, sin, kv_cache, positions, ..., scale, window)
    r = aten.view.default(a, [T, 4096])
    o = graphllm.linear.default(r, o_proj_weight)
->
    a = graphllm.rope_attention.default(q, k, v, cos, sin, kv_cache, positions, ..., scale, window,
                                        prefetch=o_proj_weight)
    ...

Runs last among the rewrites (after quantization and the linear passes have chosen o_proj's op and weight), on
GPU graphs only (`devices`): other backends and the CPU ignore the hint.
"""

import operator

import torch
from torch import fx

import graphllm.ops.attention  # noqa: F401  (registers graphllm.attention / rope_attention)
import graphllm.ops.linear  # noqa: F401  (registers graphllm.linear)
import graphllm.ops.quantized_linear  # noqa: F401  (registers the quantized linears)
from graphllm.ir.graph import StepGraph
from graphllm.passes.base import GraphPass

aten = torch.ops.aten
ops = torch.ops.graphllm

ATTENTION = (ops.attention.default, ops.rope_attention.default)
# the ops o_proj can be, and the position of its weight among their arguments
WEIGHT_ARG = {ops.linear.default: 1, aten.linear.default: 1, ops.fp8_linear.default: 1,
              ops.fp8_linear_quantized.default: 2, ops.int8_linear.default: 1, ops.int4_linear.default: 1}
# what may stand between the attention output and o_proj's input: shapes, and fp8's activation quantization
BETWEEN = (aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.contiguous.default,
           ops.fp8_quantize.default, operator.getitem)
MAX_HOPS = 4


def reader_weight(node: fx.Node) -> fx.Node | None:
    """The get_attr weight of the linear that reads node's value, through at most MAX_HOPS of BETWEEN; None when
    there is none, or more than one reader."""
    for _ in range(MAX_HOPS + 1):
        users = list(node.users)
        if not users or any(u.op != "call_function" for u in users):
            return None
        linears = [u for u in users if u.target in WEIGHT_ARG]
        if len(linears) == 1 and len(users) == 1:
            weight = linears[0].args[WEIGHT_ARG[linears[0].target]]
            return weight if isinstance(weight, fx.Node) and weight.op == "get_attr" else None
        if node.target == ops.fp8_quantize.default:  # (xq, scale): follow xq, the first of its getitems
            users = [u for u in users if u.target == operator.getitem and u.args[1] == 0]
        if len(users) != 1 or users[0].target not in BETWEEN:
            return None
        node = users[0]
    return None


class PrefetchOProj(GraphPass):
    """attention ops -> the same with prefetch=o_proj's weight; counts {"hinted": ops given a weight}."""

    name = "prefetch_o_proj"
    version = 1

    devices = ("cuda",)

    def apply(self, graph: StepGraph) -> dict[str, int]:
        hinted = 0
        for node in graph.graph.nodes:
            if node.op != "call_function" or node.target not in ATTENTION or "prefetch" in node.kwargs:
                continue
            weight = reader_weight(node)
            if weight is None:
                continue
            node.prepend(weight)  # a get_attr reads nothing: it may move up to the op that now uses it
            node.kwargs = {**node.kwargs, "prefetch": weight}
            hinted += 1
        return {"hinted": hinted}
