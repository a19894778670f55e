"""FuseRopeAttention: the rotary embedding of q and k moves into the attention op -> graphllm.rope_attention.

The attention backends then rotate q and k inside their KV-cache write: one Triton launch
(graphllm/kernels/rope_store_kv.py) instead of Inductor's two rotary kernels and store_kv. Before
and after, for one layer (apply_rotary of graphllm/kernels/rotary.py, as captured):

    c = aten.unsqueeze.default(cos, 1)                   # cos, sin: [T, D], computed once per step
    a = aten.mul.Tensor(xq, c)
    halves = aten.chunk.default(xq, 2, -1)
    n = aten.neg.default(getitem(halves, 1))
    r = aten.cat.default([n, getitem(halves, 0)], -1)
    b = aten.mul.Tensor(r, aten.unsqueeze.default(sin, 1))
    q = aten.add.Tensor(a, b)                            # ... and the same from xk to k
    out = graphllm.attention.default(q, k, v, kv_cache, positions, ...)
->
    out = graphllm.rope_attention.default(xq, xk, v, cos, sin, kv_cache, positions, ...)

The trailing scalars (scale, sliding_window and, when given, logit_softcap) move over as they are.

Both rotations must use the same cos and sin nodes, of x's dtype and shape [T, D]. Rotary nodes
that nothing else reads are erased. Like skinny_linear, only graphs whose example inputs are on
the listed devices are rewritten (`devices`, which the pass manager reads): on CPU the op would run the rotary eagerly, no faster than
what Inductor generates.
"""

import operator
from dataclasses import dataclass

import torch
from torch import fx

import graphllm.ops.attention  # noqa: F401  (registers torch.ops.graphllm.rope_attention)
from graphllm.ir.graph import StepGraph, new_node
from graphllm.passes.base import GraphPass

aten = torch.ops.aten


@dataclass
class Rotary:
    x: fx.Node  # [T, H, D]
    cos: fx.Node  # [T, D]
    sin: fx.Node
    nodes: list[fx.Node]  # the rotation's own nodes, output first


def _call(node, target, nargs: int) -> bool:
    return (isinstance(node, fx.Node) and node.op == "call_function" and node.target == target
            and not node.kwargs and len(node.args) == nargs)


def _unsqueezed(node) -> fx.Node | None:
    """t for node = unsqueeze(t, 1)."""
    return node.args[0] if _call(node, aten.unsqueeze.default, 2) and node.args[1] == 1 else None


def _val(node: fx.Node):
    return node.meta.get("val")


def _rotate_half(cat: fx.Node) -> fx.Node | None:
    """x for cat = cat([-x2, x1], -1) with (x1, x2) = chunk(x, 2, -1)."""
    if not _call(cat, aten.cat.default, 2) or cat.args[1] != -1 or len(cat.args[0]) != 2:
        return None
    neg, first = cat.args[0]
    if not _call(neg, aten.neg.default, 1):
        return None
    second = neg.args[0]
    if not (_call(first, operator.getitem, 2) and _call(second, operator.getitem, 2)
            and (first.args[1], second.args[1]) == (0, 1) and first.args[0] is second.args[0]):
        return None
    chunk = first.args[0]
    if not _call(chunk, aten.chunk.default, 3) or chunk.args[1:] != (2, -1):
        return None
    return chunk.args[0]


def match_rotary(node) -> Rotary | None:
    """Read node as apply_rotary's x * unsqueeze(cos, 1) + rotate_half(x) * unsqueeze(sin, 1)."""
    if not _call(node, aten.add.Tensor, 2):
        return None
    plain, rotated = node.args
    if not (_call(plain, aten.mul.Tensor, 2) and _call(rotated, aten.mul.Tensor, 2)):
        return None
    (x, cos_1), (cat, sin_1) = plain.args, rotated.args
    cos, sin = _unsqueezed(cos_1), _unsqueezed(sin_1)
    if cos is None or sin is None or _rotate_half(cat) is not x or not _shapes_fit(x, cos, sin):
        return None
    neg, first = cat.args[0]
    return Rotary(x, cos, sin, [node, plain, rotated, cos_1, sin_1, cat, neg, first, neg.args[0], first.args[0]])


def _shapes_fit(x: fx.Node, cos: fx.Node, sin: fx.Node) -> bool:
    """x [T, H, D] and cos, sin [T, D] of x's dtype (unknown shapes: no match)."""
    xv, cv, sv = _val(x), _val(cos), _val(sin)
    if not all(isinstance(t, torch.Tensor) for t in (xv, cv, sv)):
        return False
    return (xv.dim() == 3 and cv.dim() == 2 and cv.shape == sv.shape and cv.shape[-1] == xv.shape[-1]
            and xv.dtype == cv.dtype == sv.dtype)


def _erase_unused(graph: fx.Graph, nodes: list[fx.Node]) -> None:
    """Erase the nodes that nothing reads any more (in order, so users go before what they read)."""
    for node in nodes:
        if not node.users:
            graph.erase_node(node)


class FuseRopeAttention(GraphPass):
    """attention(rotary(xq), rotary(xk), ...) -> graphllm.rope_attention(xq, xk, ..., cos, sin, ...)."""

    name = "fuse_rope_attention"
    version = 1

    devices = ("cuda",)

    def apply(self, graph: StepGraph) -> dict[str, int]:
        fused = 0
        for node in list(graph.graph.nodes):
            if not any(_call(node, torch.ops.graphllm.attention.default, n) for n in (11, 12)):  # logit_softcap
                continue
            q, k, v, *rest = node.args
            rq, rk = match_rotary(q), match_rotary(k)
            if rq is None or rk is None or (rq.cos, rq.sin) != (rk.cos, rk.sin):
                continue
            with graph.graph.inserting_before(node):
                new = new_node(graph.graph, torch.ops.graphllm.rope_attention.default,
                                (rq.x, rk.x, v, rq.cos, rq.sin, *rest), node)
            node.replace_all_uses_with(new)
            graph.graph.erase_node(node)
            _erase_unused(graph.graph, rq.nodes)
            _erase_unused(graph.graph, rk.nodes)
            fused += 1
        return {"fused": fused}
