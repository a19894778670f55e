"""LinearEpilogue: the SwiGLU (or GeGLU) after gate_up runs in gate_up's own launch.

Runs after `linear_prologue` on GPU graphs. gate_up's weight is [gate; up] (fuse_gate_up); the pass stores it
(and its bias) with the rows interleaved, gate 0, up 0, gate 1, up 1, ... (skinny_matmul.interleave_gate_up), so
one skinny_matmul program streams one tile of rows, holds both halves of half as many outputs and writes act(gate)
* up (graphllm/kernels/skinny_matmul.py's epilogue): down_proj then reads the activation directly, and at 2-8 rows
no silu_and_mul kernel runs between the two matmuls. Before and after, for the shapes linear_prologue leaves:

    f = graphllm.add_rms_norm_linear.default(x, res, w_norm, eps, w_gate_up)     # pre-MLP norm in gate_up
    gate_up = getitem(f, 0)
    h = getitem(f, 1)
    down = graphllm.silu_and_mul_linear.default(gate_up, w_down)                 # SwiGLU in down's prologue
->
    f = graphllm.add_rms_norm_linear_act_and_mul.default(x, res, w_norm, eps, w_gate_up_interleaved, None, False,
                                                         False, True)
    act = getitem(f, 0)
    h = getitem(f, 1)
    down = graphllm.linear.default(act, w_down)

    gate_up = graphllm.linear.default(y, w_gate_up)                              # no norm before (OLMo 2)
    down = graphllm.silu_and_mul_linear.default(gate_up, w_down)
->  down = graphllm.linear.default(graphllm.linear_act_and_mul.default(y, w_gate_up_interleaved, None, False, True),
                                   w_down)

    act = graphllm.silu_and_mul.default(graphllm.linear.default(y, w_gate_up))   # linear_prologue off
->  act = graphllm.linear_act_and_mul.default(y, w_gate_up_interleaved, None, False, True)

    act = graphllm.silu_and_mul.default(graphllm.int4_linear.default(y, qw, s, z, b))   # int4 (no int4 prologue)
->  act = graphllm.int4_linear_act_and_mul.default(y, qw_interleaved, s_interleaved, z_interleaved, b_interleaved,
                                                   False, True)

(int4: qweight, scales and zeros interleaved along their columns, N; at one row the int4 GEMV's split-K finish
computes the activation, graphllm/kernels/int4_matmul.py.) GeGLU (gelu_tanh_and_mul, Gemma) the same with
gelu=True; a norm's unit_offset and the linears' biases go along. Only a gate_up output that nothing else reads is
folded. A weight or bias that is not a get_attr of this linear alone (shared, or a graph input) is left in place
(an int4 gate_up then stays as it was) and the op reads its halves (interleaved=False: each
program two half tiles, one from each half; s26 measured that 0.7-1.4% slower than no epilogue at batch 8 and 1).
The ops decide per call (graphllm/ops/linear.py): one launch at one row and where the plain product runs
skinny_matmul, the ops one after another elsewhere (the product over the interleaved weight, then silu_and_mul's
row kernel over its column pairs).
"""

import operator

import torch
from torch import fx

import graphllm.ops.linear  # noqa: F401  (registers the ops)
import graphllm.ops.quantized_linear  # noqa: F401  (and int4_linear_act_and_mul)
import graphllm.ops.silu_and_mul  # noqa: F401
from graphllm.ir.graph import StepGraph, attr_tensor, new_node
from graphllm.passes.base import GraphPass, source_uuid
from graphllm.passes.lowering.linear_prologue import _call

ops = torch.ops.graphllm

# the op with the activation in front of a linear (linear_prologue's) or alone -> (gelu, folded into a linear)
ACTIVATIONS = {ops.silu_and_mul_linear.default: (False, True), ops.gelu_tanh_and_mul_linear.default: (True, True),
               ops.silu_and_mul.default: (False, False), ops.gelu_tanh_and_mul.default: (True, False)}


def _weight_and_bias(args: tuple) -> tuple:
    return args[0], args[1] if len(args) > 1 else None


def _interleaved(graph: StepGraph, weight: fx.Node, bias: fx.Node | None, like: fx.Node) -> tuple | None:
    """(weight, bias) as new get_attr nodes of interleave_gate_up's tensors, placed before `like`; None where
    either is not a get_attr that only gate_up reads."""
    operands = [weight] if bias is None else [weight, bias]
    if not all(isinstance(p, fx.Node) and p.op == "get_attr" and len(p.users) == 1 for p in operands):
        return None
    from graphllm.kernels.skinny_matmul import interleave_gate_up  # Triton: imported where a graph needs it
    new = [graph.add_weight(f"{p.target}_interleaved", interleave_gate_up(attr_tensor(graph.gm, p)), like)
           for p in operands]
    return new[0], new[1] if bias is not None else None


def _fold_norm_gate_up(graph: StepGraph, gate_up: fx.Node, gelu: bool, where: fx.Node) -> fx.Node | None:
    """gate_up = getitem(add_rms_norm_linear(...), 0) -> getitem(add_rms_norm_linear_act_and_mul(...), 0), the
    residual's getitem moved to the new node; None where the shape is not that."""
    if not (_call(gate_up, operator.getitem) and gate_up.args[1] == 0):
        return None
    fused = gate_up.args[0]
    if not _call(fused, ops.add_rms_norm_linear.default) or not all(
            _call(u, operator.getitem) and u.args[1] in (0, 1) for u in fused.users):
        return None
    x, res, norm_w, eps, *rest = fused.args
    weight, bias = _weight_and_bias(rest)
    unit_offset = bool(rest[2]) if len(rest) > 2 else False
    interleaved = _interleaved(graph, weight, bias, where)
    weight, bias = interleaved or (weight, bias)
    g = graph.graph
    with g.inserting_before(where):
        new = new_node(g, ops.add_rms_norm_linear_act_and_mul.default,
                       (x, res, norm_w, eps, weight, bias, unit_offset, gelu, interleaved is not None), fused)
        act = new_node(g, operator.getitem, (new, 0), gate_up)
        h = new_node(g, operator.getitem, (new, 1), fused)
    for old in [u for u in fused.users if u.args[1] == 1]:
        old.replace_all_uses_with(h)
        g.erase_node(old)
    return act


def _interleaved_int4(graph: StepGraph, operands: list, like: fx.Node) -> list | None:
    """int4_linear's (qweight, scales, zeros[, bias]) with gate_up's columns interleaved (the packed tensors along
    their last dim, N): new get_attr nodes placed before `like`; None where any is not a get_attr of this linear
    alone."""
    if not all(isinstance(p, fx.Node) and p.op == "get_attr" and len(p.users) == 1 for p in operands):
        return None
    from graphllm.kernels.skinny_matmul import interleave_gate_up  # Triton: imported where a graph needs it

    def columns(t: torch.Tensor) -> torch.Tensor:
        return interleave_gate_up(t) if t.dim() == 1 else interleave_gate_up(t.t()).t().contiguous()
    return [graph.add_weight(f"{p.target}_interleaved", columns(attr_tensor(graph.gm, p)), like) for p in operands]


def _fold_int4_gate_up(graph: StepGraph, gate_up: fx.Node, gelu: bool, where: fx.Node) -> fx.Node | None:
    """act(int4_linear(y, qweight, scales, zeros[, bias])) -> int4_linear_act_and_mul over interleaved columns;
    None where the operands are shared (the op then would read its halves: not worth a pass)."""
    y, *rest = gate_up.args
    bias = rest[3] if len(rest) > 3 else None
    operands = rest[:3] + ([bias] if bias is not None else [])
    new = _interleaved_int4(graph, operands, where)
    if new is None:
        return None
    qweight, scales, zeros, *b = new
    with graph.graph.inserting_before(where):
        return new_node(graph.graph, ops.int4_linear_act_and_mul.default,
                        (y, qweight, scales, zeros, b[0] if b else None, gelu, True), gate_up)


def _fold_plain_gate_up(graph: StepGraph, gate_up: fx.Node, gelu: bool, where: fx.Node) -> fx.Node | None:
    if _call(gate_up, ops.int4_linear.default):
        return _fold_int4_gate_up(graph, gate_up, gelu, where)
    if not _call(gate_up, ops.linear.default):
        return None
    y, *rest = gate_up.args
    weight, bias = _weight_and_bias(rest)
    interleaved = _interleaved(graph, weight, bias, where)
    weight, bias = interleaved or (weight, bias)
    with graph.graph.inserting_before(where):
        return new_node(graph.graph, ops.linear_act_and_mul.default,
                        (y, weight, bias, gelu, interleaved is not None), gate_up)


class LinearEpilogue(GraphPass):
    """Fold SwiGLU / GeGLU into the gate_up linear that feeds it; counts the folds by the prologue gate_up has."""

    name = "linear_epilogue"
    version = 3  # 2: gate_up's rows interleaved; 3: int4_linear's gate_up too

    devices = ("cuda",)

    def __init__(self, int4_only: bool = False):
        self.int4_only = int4_only  # fold only int4_linear gate_ups (the default's: measured faster only there)

    def uuid(self) -> str:
        return source_uuid(type(self).__module__, f"{self.name}:{self.version}:int4_only={self.int4_only}")

    def apply(self, graph: StepGraph) -> dict[str, int]:
        counts = {"add_rms_norm": 0, "none": 0}
        g = graph.graph
        for node in [n for n in g.nodes if n.op == "call_function" and n.target in ACTIVATIONS]:
            if node.kwargs:
                continue
            gelu, into_linear = ACTIVATIONS[node.target]
            gate_up = node.args[0]
            if not isinstance(gate_up, fx.Node) or len(gate_up.users) != 1:
                continue
            if self.int4_only and not _call(gate_up, ops.int4_linear.default):
                continue
            act = _fold_norm_gate_up(graph, gate_up, gelu, node)
            kind = "add_rms_norm"
            if act is None:
                act, kind = _fold_plain_gate_up(graph, gate_up, gelu, node), "none"
            if act is None:
                continue
            if into_linear:  # down = linear(act, w_down[, b_down])
                with g.inserting_before(node):
                    down = new_node(g, ops.linear.default, (act, *node.args[1:]), node)
                node.replace_all_uses_with(down)
            else:
                node.replace_all_uses_with(act)
            source = gate_up.args[0]  # add_rms_norm_linear, when gate_up is its getitem
            g.erase_node(node)
            g.erase_node(gate_up)
            if kind == "add_rms_norm":
                g.erase_node(source)
            counts[kind] += 1
        return counts
