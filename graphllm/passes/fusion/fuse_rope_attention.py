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

A per-head RMSNorm before both rotations (Qwen3's q_norm / k_norm, Gemma 3's; graphllm.rms_norm nodes by then,
fuse_add_rmsnorm runs first) moves in too, when nothing else reads the normed q and k, both norms have the same
eps and unit_offset, and each keeps its input's dtype:

    xq = graphllm.rms_norm.default(q_view, wq, 1e-06)    # and xk from k_view with wk
    ... the rotary and attention above
->
    out = graphllm.rope_attention.default(q_view, k_view, v, cos, sin, kv_cache, ..., logit_softcap,
                                          wq, wk, 1e-06, False)

so that at decode the triton backend's decode kernel norms the heads it already loads (rope_decode.py): two
launches a layer fewer. Other paths run the norms first (rotary.normed_heads).

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
import graphllm.ops.rms_norm  # noqa: F401  (registers torch.ops.graphllm.rms_norm, the head norms it folds)
from graphllm.ir.graph import StepGraph, new_node
from graphllm.passes.base import GraphPass, source_uuid

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


def _head_norm(x: fx.Node) -> tuple | None:
    """(input, weight, eps, unit_offset) for x = graphllm.rms_norm(input, weight, eps[, unit_offset]) that keeps
    its input's dtype; else None."""
    if not any(_call(x, torch.ops.graphllm.rms_norm.default, n) for n in (3, 4)):
        return None
    x_in, weight, eps, *offset = x.args
    xv, wv = _val(x_in), _val(x)
    if not (isinstance(xv, torch.Tensor) and isinstance(wv, torch.Tensor) and xv.dtype == wv.dtype):
        return None
    return x_in, weight, eps, bool(offset and offset[0])


def _foldable_norms(rq: Rotary, rk: Rotary) -> tuple | None:
    """((q input, k input), (q weight, k weight, eps, unit_offset)) when both rotations read a head norm that
    only they read, with one eps and unit_offset; else None."""
    nq, nk = _head_norm(rq.x), _head_norm(rk.x)
    if nq is None or nk is None or nq[2:] != nk[2:] or rq.x is rk.x:
        return None
    if not (set(rq.x.users) <= set(rq.nodes) and set(rk.x.users) <= set(rk.nodes)):
        return None
    return (nq[0], nk[0]), (nq[1], nk[1], *nq[2:])


def _erase_unused(graph: fx.Graph, nodes: list[fx.Node]) -> None:
    """Erase the nodes that nothing reads any more (in order, so users go before what they read)."""
    for node in nodes:
        if not node.users:
            graph.erase_node(node)


class FuseRopeAttention(GraphPass):
    """attention(rotary(xq), rotary(xk), ...) -> graphllm.rope_attention(xq, xk, ..., cos, sin, ...); with
    fold_head_norms (the default) a per-head rms_norm of q and k before the rotary moves in too."""

    name = "fuse_rope_attention"
    version = 2

    devices = ("cuda",)

    def __init__(self, fold_head_norms: bool = True):
        self.fold_head_norms = fold_head_norms

    def uuid(self) -> str:
        return source_uuid(type(self).__module__, f"{self.name}:{self.version}:norms={self.fold_head_norms}")

    def apply(self, graph: StepGraph) -> dict[str, int]:
        fused = norms = 0
        for node in list(graph.graph.nodes):
            if not any(_call(node, torch.ops.graphllm.attention.default, n) for n in (11, 12)):  # logit_softcap
                continue
            q, k, v, *rest = node.args
            rq, rk = match_rotary(q), match_rotary(k)
            if rq is None or rk is None or (rq.cos, rq.sin) != (rk.cos, rk.sin):
                continue
            folded = _foldable_norms(rq, rk) if self.fold_head_norms else None
            xq, xk = (rq.x, rk.x) if folded is None else folded[0]
            args = (xq, xk, v, rq.cos, rq.sin, *rest)
            if folded is not None:
                args = (*args, *([0.0] if len(rest) == 8 else []), *folded[1])  # an explicit logit_softcap first
            with graph.graph.inserting_before(node):
                new = new_node(graph.graph, torch.ops.graphllm.rope_attention.default, args, node)
            node.replace_all_uses_with(new)
            graph.graph.erase_node(node)
            _erase_unused(graph.graph, rq.nodes + rk.nodes + ([rq.x, rk.x] if folded is not None else []))
            fused += 1
            norms += folded is not None
        return {"fused": fused, **({"head_norms": norms} if norms else {})}
