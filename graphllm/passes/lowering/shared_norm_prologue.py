"""SharedNormPrologue: a norm read by a graphllm.linear and by other ops folds into that linear, which stores it.

linear_prologue folds a norm only where the linear is its one reader. A mixture-of-experts layer's post-attention
norm has two: the router's linear and the experts (graphllm.fused_moe), so at batch 1 it stays a kernel of its own
between o_proj and the router, one launch a layer. Here the first linear that reads it takes it in its prologue
and its launch also stores the norm's output for the other readers (skinny_matmul.rms_norm_matmul_normed):

    n = graphllm.add_rms_norm.default(x, o_proj, w_norm, eps)
    y = getitem(n, 0)
    h = getitem(n, 1)
    logits = graphllm.linear.default(y, w_router)
    moe = graphllm.fused_moe.default(y, logits, w13, w2, k, renorm)
->
    f = graphllm.add_rms_norm_linear_normed.default(x, o_proj, w_norm, eps, w_router, None, False)
    logits = getitem(f, 0)
    h = getitem(f, 1)
    moe = graphllm.fused_moe.default(getitem(f, 2), logits, w13, w2, k, renorm)

The fused op takes one launch at one row in half precision on CUDA (ops/linear.takes_fused_kernel) and runs the
norm, then the linear, everywhere else: the function is the same (tests/passes/test_shared_norm_prologue.py).
Runs after linear_prologue (whose single-reader folds come first), on GPU graphs. Off by default
(`CompileConfig.shared_norm_prologue`, `--shared-norm-prologue`) until a GPU A/B says it pays.
"""

import operator

import torch
from torch import fx

import graphllm.ops.linear  # noqa: F401  (registers add_rms_norm_linear_normed)
from graphllm.ir.graph import StepGraph, new_node
from graphllm.passes.base import GraphPass
from graphllm.passes.lowering.linear_prologue import _call, _fused_args, _linear_operands

ops = torch.ops.graphllm


def _fold(graph: fx.Graph, norm: fx.Node) -> bool:
    """norm = add_rms_norm(...) whose output y a graphllm.linear reads (as its x) beside other readers."""
    if not all(_call(u, operator.getitem) and u.args[1] in (0, 1) for u in norm.users):
        return False
    outputs = [u for u in norm.users if u.args[1] == 0]
    if len(outputs) != 1:
        return False
    y = outputs[0]
    lins = [u for u in y.users if _call(u, ops.linear.default) and u.args[0] is y and y not in u.args[1:]]
    if not lins or len(y.users) < 2:
        return False  # no linear, or linear_prologue's case (it folds a norm with one reader)
    lin = lins[0]
    _, params = _linear_operands(lin)
    readers = [u for g in norm.users for u in g.users]
    order = {n: i for i, n in enumerate(graph.nodes)}
    first = min(readers, key=order.__getitem__)
    for p in params:  # the linear's weight and bias are read where the norm's first reader was
        if isinstance(p, fx.Node) and order[p] > order[first]:
            if p.op != "get_attr":
                return False
            first.prepend(p)
    with graph.inserting_before(first):
        fused = new_node(graph, ops.add_rms_norm_linear_normed.default, _fused_args(norm, 4, params), lin)
        outs = [new_node(graph, operator.getitem, (fused, i), src) for i, src in enumerate((lin, norm, y))]
    lin.replace_all_uses_with(outs[0])
    for old in [u for u in norm.users if u.args[1] == 1]:
        old.replace_all_uses_with(outs[1])
        graph.erase_node(old)
    y.replace_all_uses_with(outs[2])
    for old in (lin, y, norm):
        graph.erase_node(old)
    return True


class SharedNormPrologue(GraphPass):
    """Fold each add_rms_norm that a graphllm.linear reads beside other ops into that linear (module docstring);
    counts the norms folded."""

    name = "shared_norm_prologue"
    version = 1

    devices = ("cuda",)

    def apply(self, graph: StepGraph) -> dict[str, int]:
        g = graph.graph
        folded = sum(_fold(g, n) for n in [n for n in g.nodes if _call(n, ops.add_rms_norm.default)])
        return {"add_rms_norm": folded}
