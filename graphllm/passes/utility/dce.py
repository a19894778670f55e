"""DeadCodeElimination: remove nodes nobody reads and weights nobody reaches.

Other passes leave dead values behind (the q/k/v linears after fusion, an unfused weight's
get_attr). A node goes when it has no users and no side effect; the attention op writes its
kv_cache argument, so it stays even when its output is unused:

    before                                              after
    w_q = get_attr[model.layers.0.q_proj.weight]        (gone, and the parameter with it)
    q = linear(x, w_q)            # no users            (gone)
    attn = graphllm.attention(q2, k, v, kv_caches_0, ...)   attn = graphllm.attention(...)  (kept)
    _assert_tensor_metadata(x, dtype=f32)               (kept: asserts are side effects)

Counts: {"nodes": nodes erased (get_attr included), "weights": parameters deleted}.
"""

import torch
from torch import fx

from graphllm.ir.graph import StepGraph
from graphllm.passes.base import GraphPass


class DeadCodeElimination(GraphPass):
    name = "dce"

    def apply(self, graph: StepGraph) -> dict[str, int]:
        before = len(graph.graph.nodes)
        graph.graph.eliminate_dead_code(is_impure_node=has_side_effects)
        nodes = before - len(graph.graph.nodes)
        return {"nodes": nodes, "weights": graph.drop_unused_weights()}


def has_side_effects(node: fx.Node) -> bool:
    """torch's own verdict, or an op whose schema writes an input (custom ops such as attention).

    The schema check does not rely on Node.is_impure covering mutable custom ops in every
    torch release.
    """
    return node.is_impure() or writes_an_input(node)


def writes_an_input(node: fx.Node) -> bool:
    return (node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload)
            and node.target._schema.is_mutable)
