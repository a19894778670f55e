"""FuseSiluMul: silu(gate) * up over the halves of one fused gate/up output -> silu_and_mul.

Runs after `fuse_gate_up`, which makes gate and up the two halves of one linear. Before
(one MLP, I = intermediate size):

    gate_up: "f32[T, 2I]" = aten.linear.default(h, w_gate_up)
    halves = aten.split_with_sizes.default(gate_up, [I, I], -1)
    gate: "f32[T, I]" = getitem(halves, 0)
    up: "f32[T, I]" = getitem(halves, 1)
    act: "f32[T, I]" = aten.silu.default(gate)
    y: "f32[T, I]" = aten.mul.Tensor(act, up)          # or mul(up, act)

After:

    gate_up: "f32[T, 2I]" = aten.linear.default(h, w_gate_up)
    y: "f32[T, I]" = graphllm.silu_and_mul.default(gate_up)

Gemma's GeGLU, `gelu(gate, approximate="tanh") * up`, becomes graphllm.gelu_tanh_and_mul the same way.
Graphs where gate and up come from two separate linears are left alone: there is no single
tensor to hand the op. The split, getitems and silu are erased once nothing else reads them.
"""

import operator
from dataclasses import dataclass

import torch
from torch import fx

import graphllm.ops.silu_and_mul  # noqa: F401  (registers torch.ops.graphllm.silu_and_mul)
from graphllm.ir.graph import StepGraph, new_node
from graphllm.passes.base import GraphPass

aten = torch.ops.aten


@dataclass
class SiluMulMatch:
    mul: fx.Node  # y
    act: fx.Node  # silu(gate)
    gate: fx.Node  # getitem(halves, 0)
    up: fx.Node  # getitem(halves, 1)
    halves: fx.Node  # split_with_sizes(gate_up, [I, I], -1)
    gate_up: fx.Node  # [..., 2I]
    op: object = torch.ops.graphllm.silu_and_mul.default  # or gelu_tanh_and_mul (GeGLU)


def _is_call(node, target) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_function" and node.target == target


def _halves_of(node) -> tuple[fx.Node, int] | None:
    """(the split, index) for node = getitem(split_with_sizes(t, [I, I], last dim), index)."""
    if not _is_call(node, operator.getitem) or not _is_call(node.args[0], aten.split_with_sizes.default):
        return None
    split = node.args[0]
    sizes = split.args[1] if len(split.args) > 1 else split.kwargs.get("split_sizes", ())
    dim = split.args[2] if len(split.args) > 2 else split.kwargs.get("dim", 0)
    equal = len(sizes) == 2 and all(type(s) is int for s in sizes) and sizes[0] == sizes[1]
    return (split, node.args[1]) if equal and _is_last_dim(split.args[0], dim) else None


def _is_last_dim(node: fx.Node, dim: int) -> bool:
    if dim == -1:
        return True
    val = node.meta.get("val")
    return isinstance(val, torch.Tensor) and dim == val.dim() - 1


def _activation_op(act) -> object | None:
    """The fused op for act = silu(gate) or gelu(gate, approximate="tanh"), else None."""
    if _is_call(act, aten.silu.default) and not act.kwargs and len(act.args) == 1:
        return torch.ops.graphllm.silu_and_mul.default
    approximate = act.kwargs.get("approximate") if isinstance(act, fx.Node) else None
    if (_is_call(act, aten.gelu.default) and len(act.args) == 1 and set(act.kwargs) == {"approximate"}
            and approximate == "tanh"):
        return torch.ops.graphllm.gelu_tanh_and_mul.default
    return None


def _match_operands(mul: fx.Node, act, up) -> SiluMulMatch | None:
    op = _activation_op(act)
    if op is None:
        return None
    gate_half, up_half = _halves_of(act.args[0]), _halves_of(up)
    if gate_half is None or up_half is None or gate_half[0] is not up_half[0]:
        return None
    if (gate_half[1], up_half[1]) != (0, 1):
        return None
    split = gate_half[0]
    return SiluMulMatch(mul, act, act.args[0], up, split, split.args[0], op)


def match_silu_mul(mul: fx.Node) -> SiluMulMatch | None:
    """Read mul as silu(first half) * second half of one split, in either operand order."""
    if not _is_call(mul, aten.mul.Tensor) or mul.kwargs or len(mul.args) != 2:
        return None
    a, b = mul.args
    return _match_operands(mul, a, b) or _match_operands(mul, b, a)


def rewrite_silu_mul(graph: fx.Graph, match: SiluMulMatch) -> None:
    """y = silu_and_mul(gate_up); erase the silu, getitems and split when nothing else reads them."""
    with graph.inserting_before(match.mul):
        fused = new_node(graph, match.op, (match.gate_up,), match.mul)
    match.mul.replace_all_uses_with(fused)
    graph.erase_node(match.mul)
    for node in (match.act, match.gate, match.up, match.halves):
        if not node.users:
            graph.erase_node(node)


class FuseSiluMul(GraphPass):
    """mul(silu(gate), up) over one split gate/up output -> graphllm.silu_and_mul (GeGLU: gelu_tanh_and_mul)."""

    name = "fuse_silu_mul"
    version = 2  # 2: GeGLU too

    def apply(self, graph: StepGraph) -> dict[str, int]:
        fused = 0
        for node in list(graph.graph.nodes):
            match = match_silu_mul(node)
            if match is not None:
                rewrite_silu_mul(graph.graph, match)
                fused += 1
        return {"fused": fused}
