"""LinearPrologue: the norm or activation that feeds a graphllm.linear becomes that linear's prologue.

Runs after `skinny_linear` (which makes every linear a graphllm.linear) on GPU graphs, so a
decode step runs each norm and SwiGLU inside the next matmul kernel (graphllm/ops/linear.py).
Before and after, for the three shapes a decoder layer has:

    n = graphllm.add_rms_norm.default(x, o_proj, w_norm, eps)      # post-attention norm
    y = getitem(n, 0)
    h = getitem(n, 1)                                               # the residual stream
    gate_up = graphllm.linear.default(y, w_gate_up)
->
    f = graphllm.add_rms_norm_linear.default(x, o_proj, w_norm, eps, w_gate_up)
    gate_up = getitem(f, 0)
    h = getitem(f, 1)

    y = graphllm.rms_norm.default(x, w_norm, eps)                   # first layer's input norm
    qkv = graphllm.linear.default(y, w_qkv, b_qkv)
->  qkv = graphllm.rms_norm_linear.default(x, w_norm, eps, w_qkv, b_qkv)

    act = graphllm.silu_and_mul.default(gate_up)
    down = graphllm.linear.default(act, w_down)
->  down = graphllm.silu_and_mul_linear.default(gate_up, w_down)

(GeGLU's graphllm.gelu_tanh_and_mul the same, into graphllm.gelu_tanh_and_mul_linear.)

With fp8=True (CompileConfig.fp8_linear_prologue) the same three shapes fold into graphllm.fp8_linear too,
into fp8_add_rms_norm_linear, fp8_rms_norm_linear and fp8_silu_and_mul_linear / fp8_gelu_tanh_and_mul_linear
(graphllm/ops/quantized_linear.py), whose arguments after their own are the fp8 linear's (weight, weight_scale,
input_scale, bias); quantize_fp8_activations then splits only the fp8 linears left (o_proj).

A norm's unit_offset (Gemma's 1 + weight, fuse_add_rmsnorm) goes along, after the linear's bias.
Only a norm or activation whose output nothing else reads is folded (the final norm reaches
lm_head through a row gather, so it stays). Like skinny_linear, only graphs whose example
inputs are on the listed devices are rewritten (`devices`, which the pass manager reads).
"""

import operator

import torch
from torch import fx

import graphllm.ops.linear  # noqa: F401  (registers the fused ops)
import graphllm.ops.quantized_linear  # noqa: F401  (and the fp8 ones)
import graphllm.ops.silu_and_mul  # noqa: F401  (registers the activations the fused ops take in)
from graphllm.ir.graph import StepGraph, new_node
from graphllm.passes.base import GraphPass, source_uuid

ops = torch.ops.graphllm


def _call(node, target) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_function" and node.target == target and not node.kwargs


def _linear_operands(node: fx.Node) -> tuple[fx.Node, tuple]:
    """(x, the arguments a fused op appends after its own): (weight,) or (weight, bias) for graphllm.linear,
    (weight, weight_scale, input_scale, bias) for fp8_linear."""
    x, *params = node.args
    if node.target == ops.fp8_linear.default:
        return x, tuple(params) + (None,) * (4 - len(params))
    return x, tuple(params[:1] if len(params) < 2 or params[1] is None else params[:2])


def _fused_args(source: fx.Node, arity: int, params: tuple) -> tuple:
    """The fused op's arguments: source's first `arity` (its own), then the linear's (weight and bias; fp8:
    weight, weight_scale, input_scale, bias), then a norm's unit_offset where it has one set (Gemma's): the
    fused ops take it after the bias."""
    own, extra = source.args[:arity], source.args[arity:]
    if extra and extra[0]:
        return (*own, *params, *((None,) if len(params) == 1 else ()), *extra)
    return (*own, *params)


def _fold_add_rms_norm(graph: fx.Graph, lin: fx.Node, fused_op=None) -> bool:
    """lin = linear(getitem(add_rms_norm(...), 0), w[, b]) with the norm's outputs read only there and by getitem 1."""
    y, params = _linear_operands(lin)
    if not (_call(y, operator.getitem) and y.args[1] == 0 and len(y.users) == 1):
        return False
    norm = y.args[0]
    if not _call(norm, ops.add_rms_norm.default) or not all(
            _call(u, operator.getitem) and u.args[1] in (0, 1) for u in norm.users):
        return False
    with graph.inserting_before(lin):
        fused = new_node(graph, fused_op or ops.add_rms_norm_linear.default, _fused_args(norm, 4, params), lin)
        out = new_node(graph, operator.getitem, (fused, 0), lin)
        new_residual = new_node(graph, operator.getitem, (fused, 1), norm)
    lin.replace_all_uses_with(out)
    for old in [u for u in norm.users if u.args[1] == 1]:
        old.replace_all_uses_with(new_residual)
        graph.erase_node(old)
    for old in (lin, y, norm):
        graph.erase_node(old)
    return True


def _fold_single(graph: fx.Graph, lin: fx.Node, source, fused_op, arity: int) -> bool:
    """lin = linear(source(args...), w[, b]) with source read only there -> fused_op(args..., w, b)."""
    y, params = _linear_operands(lin)
    if not _call(y, source) or len(y.users) != 1:
        return False
    with graph.inserting_before(lin):
        fused = new_node(graph, fused_op, _fused_args(y, arity, params), lin)
    lin.replace_all_uses_with(fused)
    graph.erase_node(lin)
    graph.erase_node(y)
    return True


# linear op -> its fused ops: add_rms_norm, rms_norm, silu_and_mul, gelu_tanh_and_mul in front of it
FUSED = {
    ops.linear.default: (ops.add_rms_norm_linear.default, ops.rms_norm_linear.default,
                         ops.silu_and_mul_linear.default, ops.gelu_tanh_and_mul_linear.default),
    ops.fp8_linear.default: (ops.fp8_add_rms_norm_linear.default, ops.fp8_rms_norm_linear.default,
                             ops.fp8_silu_and_mul_linear.default, ops.fp8_gelu_tanh_and_mul_linear.default),
}


class LinearPrologue(GraphPass):
    """Fold norms and SwiGLU into the graphllm.linear they feed; counts each kind folded. fp8=True: also into
    fp8_linear (CompileConfig.fp8_linear_prologue), before quantize_fp8_activations splits what is left, so
    that at one row the fp8 kernel computes the norm or activation, its row scale and the float8 operand
    itself (fp8_matmul.fp8_prologue_matmul) instead of Inductor's norm + quantize kernel and silu_and_mul_fp8.
    (int4_linear had the same from s40 to s42, int4=True, version 5: removed, its GEMV loop 1.4-5.5x as long.)"""

    name = "linear_prologue"
    version = 6  # 2: norms with unit_offset (Gemma's) fold too; 3: GeGLU; 4: fp8_linear (fp8=True); 5: int4_linear
    # (int4=True); 6: int4 removed

    devices = ("cuda",)

    def __init__(self, fp8: bool = False):
        self.fp8 = fp8

    def uuid(self) -> str:
        return source_uuid(type(self).__module__, f"{self.name}:{self.version}:fp8={self.fp8}")

    def apply(self, graph: StepGraph) -> dict[str, int]:
        counts = {"add_rms_norm": 0, "rms_norm": 0, "silu_and_mul": 0, "gelu_tanh_and_mul": 0}
        g = graph.graph
        targets = (ops.linear.default, ops.fp8_linear.default) if self.fp8 else (ops.linear.default,)
        for lin in [n for n in g.nodes if n.op == "call_function" and n.target in targets]:
            add_norm, norm, silu, gelu = FUSED[lin.target]
            if _fold_add_rms_norm(g, lin, add_norm):
                counts["add_rms_norm"] += 1
            elif _fold_single(g, lin, ops.rms_norm.default, norm, 3):
                counts["rms_norm"] += 1
            elif _fold_single(g, lin, ops.silu_and_mul.default, silu, 1):
                counts["silu_and_mul"] += 1
            elif _fold_single(g, lin, ops.gelu_tanh_and_mul.default, gelu, 1):
                counts["gelu_tanh_and_mul"] += 1
        return counts
