"""FuseAddRMSNorm: each RMSNorm module becomes one rms_norm node, taking in the residual add before it.

A group is the nodes whose innermost RMSNorm entry in `nn_module_stack` is the same module
call. Before (float32 graph as captured, post_attention_layernorm of layer 0; the f32 -> f32
casts and the asserts are gone once eliminate_noops has run, and both forms match; in bfloat16
the casts are real. Note that the residual stream reads the no-op cast `hf`, not `h`):

    h: "f32[T, H]" = aten.add.Tensor(x, o_proj)                   # residual add, layer 0
    _assert_tensor_metadata(h, dtype=f32)
    hf: "f32[T, H]" = aten.to.dtype(h, f32)
    sq: "f32[T, H]" = aten.pow.Tensor_Scalar(hf, 2)
    ms: "f32[T, 1]" = aten.mean.dim(sq, [-1], True)
    ms_eps: "f32[T, 1]" = aten.add.Tensor(ms, 1e-06)
    inv: "f32[T, 1]" = aten.rsqrt.default(ms_eps)
    n: "f32[T, H]" = aten.mul.Tensor(hf, inv)
    _assert_tensor_metadata(n, dtype=f32)
    nc: "f32[T, H]" = aten.to.dtype(n, f32)                       # back to h's dtype
    y: "f32[T, H]" = aten.mul.Tensor(w, nc)                       # w: get_attr [H]
    ... = aten.add.Tensor(hf, down_proj)                          # next residual add

After:

    fused = graphllm.add_rms_norm.default(x, o_proj, w, 1e-06)
    y: "f32[T, H]" = getitem(fused, 0)
    h: "f32[T, H]" = getitem(fused, 1)
    ... = aten.add.Tensor(h, down_proj)

When the group's input is not an add of two tensors of one shape and dtype (the embedding,
Qwen3's per-head q/k norms over [T, heads, head_dim]) the group alone becomes
`y = graphllm.rms_norm.default(h, w, eps)`.

Gemma's RMSNorm (models/gemma.py) scales by 1 + weight in float32 and casts once at the end:

    n: "f32[T, H]" = aten.mul.Tensor(hf, inv)                     # hf, inv as above
    wf: "f32[H]" = aten.to.dtype(w, f32)
    w1: "f32[H]" = aten.add.Tensor(wf, 1.0)
    s: "f32[T, H]" = aten.mul.Tensor(n, w1)
    y: "bf16[T, H]" = aten.to.dtype(s, bf16)                      # h's dtype

and becomes the same ops with a last argument unit_offset=True (`graphllm.rms_norm.default(h, w, eps,
True)`), which linear_prologue carries into the fused matmul prologue.

A group that is not exactly this math, or whose
inner values are read elsewhere, is left alone. The replacement ops repeat RMSNorm's math op by
op, so float32 results are bit-identical on CPU.
"""

import operator
from dataclasses import dataclass

import torch
from torch import fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

import graphllm.ops.rms_norm  # noqa: F401  (registers torch.ops.graphllm.rms_norm / add_rms_norm)
from graphllm.ir.graph import StepGraph, new_node
from graphllm.models.gemma import GemmaRMSNorm
from graphllm.models.layers import RMSNorm
from graphllm.passes.base import GraphPass

aten = torch.ops.aten
ASSERT = aten._assert_tensor_metadata.default
NORM_TYPES = (RMSNorm, GemmaRMSNorm)
NORM_TYPE_NAMES = tuple(f"{t.__module__}.{t.__qualname__}" for t in NORM_TYPES)


@dataclass
class NormMatch:
    """One RMSNorm call: y = weight * to(xf * rsqrt(mean(xf ** 2, -1) + eps), x.dtype), xf = float(x)."""

    input: fx.Node  # x, from outside the group
    cast: fx.Node | None  # to(x, f32) when the graph has it; in f32 the residual stream may read it
    weight: fx.Node  # get_attr [D]
    eps: float
    output: fx.Node  # y
    nodes: list[fx.Node]  # the whole group, asserts included, in graph order
    unit_offset: bool = False  # Gemma's: y = to(xf * rsqrt(...) * (1 + float(weight)), x.dtype)


# ---- finding the groups ---------------------------------------------------------------------

def _is_rmsnorm(module_type) -> bool:
    if isinstance(module_type, type):
        return issubclass(module_type, NORM_TYPES)
    return module_type in NORM_TYPE_NAMES


def rmsnorm_groups(graph: fx.Graph) -> list[list[fx.Node]]:
    """call_function nodes grouped by their innermost RMSNorm module call, in graph order."""
    groups: dict[str, list[fx.Node]] = {}
    for node in graph.nodes:
        stack = node.meta.get("nn_module_stack") or {}
        keys = [key for key, (_, module_type) in stack.items() if _is_rmsnorm(module_type)]
        if node.op == "call_function" and keys:
            groups.setdefault(keys[-1], []).append(node)
    return list(groups.values())


# ---- matching one group ---------------------------------------------------------------------

def _args(node, target, arity: int) -> tuple:
    """node's `arity` args when node is `target(...)` without kwargs, else `arity` Nones."""
    if (isinstance(node, fx.Node) and node.op == "call_function" and node.target == target
            and not node.kwargs and len(node.args) == arity):
        return node.args
    return (None,) * arity


def _dtype(node) -> torch.dtype | None:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return val.dtype if isinstance(val, torch.Tensor) else None


def _mul_operands(node, is_first) -> tuple:
    """(a, b) with is_first(a) for node = mul(a, b) or mul(b, a): products commute exactly."""
    a, b = _args(node, aten.mul.Tensor, 2)
    if a is not None and is_first(a):
        return a, b
    return (b, a) if b is not None and is_first(b) else (None, None)


def _strip_cast(node, dtype: torch.dtype | None = None) -> tuple:
    """(the cast, its input) for node = to.dtype(input, dtype) (any dtype if None), else (None, node)."""
    source, to = _args(node, aten.to.dtype, 2)
    if source is not None and (dtype is None or to == dtype):
        return node, source
    return None, node


def _match_normalized(n) -> dict | None:
    """Name the nodes of n = xf * rsqrt(mean(xf ** 2, [-1], True) + eps)."""
    inv, xf = _mul_operands(n, lambda a: _args(a, aten.rsqrt.default, 1)[0] is not None)
    (ms_eps,) = _args(inv, aten.rsqrt.default, 1)
    ms, eps = _args(ms_eps, aten.add.Tensor, 2)
    sq, dims, keepdim = _args(ms, aten.mean.dim, 3)
    base, exponent = _args(sq, aten.pow.Tensor_Scalar, 2)
    if base is None or base is not xf or dims != [-1] or keepdim is not True:
        return None
    if exponent != 2 or isinstance(eps, bool) or not isinstance(eps, (int, float)):
        return None
    return dict(eps=float(eps), xf=xf, nodes=[n, inv, ms_eps, ms, sq])


def _unit_weight(node) -> tuple | None:
    """(w, the nodes) for node = to(w, f32) + 1.0 (or w + 1.0 where w is float32), w a get_attr."""
    wf, one = _args(node, aten.add.Tensor, 2)
    if isinstance(one, bool) or one != 1.0 or not isinstance(wf, fx.Node):
        return None
    cast, w = _strip_cast(wf, torch.float32)
    if not (isinstance(w, fx.Node) and w.op == "get_attr"):
        return None
    return w, [node] + ([cast] if cast is not None else [])


def _match_body(out: fx.Node) -> dict | None:
    """Name the nodes of y = w * to(n) (RMSNorm) or y = to(n * (1 + float(w))) (Gemma's), from y back;
    n = xf * rsqrt(mean(xf ** 2, [-1], True) + eps)."""
    weight, nc = _mul_operands(out, lambda a: isinstance(a, fx.Node) and a.op == "get_attr")
    if weight is not None:
        cast_back, n = _strip_cast(nc)
        parts = _match_normalized(n)
        if parts is None:
            return None
        return dict(weight=weight, eps=parts["eps"], xf=parts["xf"], cast_back=cast_back, unit_offset=False,
                    body=[out, nc, *parts["nodes"]])
    cast_back, scaled = _strip_cast(out)
    n, w1 = _mul_operands(scaled, lambda a: _match_normalized(a) is not None)
    unit = _unit_weight(w1) if n is not None else None
    if unit is None:
        return None
    parts = _match_normalized(n)
    return dict(weight=unit[0], eps=parts["eps"], xf=parts["xf"], cast_back=cast_back, unit_offset=True,
                body=[out, scaled, *unit[1], *parts["nodes"]])


def _casts_agree(x_dtype, cast, cast_back) -> bool:
    """The graph normalises in float32 and returns x's dtype, as the fused op does."""
    if x_dtype is None:
        return False
    to_float = cast is not None or x_dtype == torch.float32
    back = cast_back.args[1] == x_dtype if cast_back is not None else x_dtype == torch.float32
    return to_float and back


def _is_closed(match: NormMatch, body: list[fx.Node]) -> bool:
    """The group is the body (+ cast, asserts); only y, and a no-op cast, are read from outside."""
    group, known = set(match.nodes), set(body) | {match.cast}
    if any(n not in known and n.target != ASSERT for n in match.nodes):
        return False
    inner = [n for n in body if n is not match.output]
    if match.cast is not None and _dtype(match.input) != torch.float32:
        inner.append(match.cast)  # a real cast: erasing it would take a value from its readers
    return all(n in group and set(n.users) <= group for n in inner)


def match_rmsnorm(group: list[fx.Node]) -> NormMatch | None:
    """Read the group as RMSNorm.forward; None when it computes anything else."""
    body = [n for n in group if n.target != ASSERT]
    parts = _match_body(body[-1]) if body else None
    if parts is None:
        return None
    cast, x = _strip_cast(parts["xf"], torch.float32) if parts["xf"] in group else (None, parts["xf"])
    if x in group or not _casts_agree(_dtype(x), cast, parts["cast_back"]):
        return None
    match = NormMatch(x, cast, parts["weight"], parts["eps"], body[-1], group, parts["unit_offset"])
    return match if _is_closed(match, [n for n in parts["body"] if n is not cast]) else None


# ---- rewriting ------------------------------------------------------------------------------

def _residual_operands(x: fx.Node) -> tuple | None:
    """(a, b) when x = a + b of two tensors of one dtype and shape (no broadcast, no promotion)."""
    a, b = _args(x, aten.add.Tensor, 2)
    if not (isinstance(a, fx.Node) and isinstance(b, fx.Node)):
        return None
    va, vb = a.meta.get("val"), b.meta.get("val")
    if not (isinstance(va, torch.Tensor) and isinstance(vb, torch.Tensor)) or va.dtype != vb.dtype:
        return None
    same = va.dim() == vb.dim() and all(statically_known_true(p == q) for p, q in zip(va.shape, vb.shape))
    return (a, b) if same else None


def _release_cast(match: NormMatch) -> None:
    """Point outside readers of the cast at x: it is a no-op (f32 -> f32) when it has them."""
    if match.cast is not None:
        group = set(match.nodes)
        match.cast.replace_all_uses_with(match.input, delete_user_cb=lambda user: user not in group)


def _erase(graph: fx.Graph, nodes: list[fx.Node]) -> None:
    for node in reversed(nodes):  # readers before what they read
        graph.erase_node(node)


def _unit(match: NormMatch) -> tuple:
    """The ops' unit_offset argument, given only where it is set (RMSNorm's nodes keep their old form)."""
    return (True,) if match.unit_offset else ()


def rewrite_rms_norm(graph: fx.Graph, match: NormMatch) -> None:
    """y = rms_norm(x, w, eps) in place of the group."""
    _release_cast(match)
    with graph.inserting_before(match.output):
        fused = new_node(graph, torch.ops.graphllm.rms_norm.default,
                          (match.input, match.weight, match.eps, *_unit(match)), match.output)
    match.output.replace_all_uses_with(fused)
    _erase(graph, match.nodes)


def rewrite_add_rms_norm(graph: fx.Graph, match: NormMatch, a: fx.Node, b: fx.Node) -> None:
    """(y, x) = add_rms_norm(a, b, w, eps) in place of x = a + b and the group."""
    x, group = match.input, set(match.nodes)
    _release_cast(match)
    with graph.inserting_after(x):
        fused = new_node(graph, torch.ops.graphllm.add_rms_norm.default,
                          (a, b, match.weight, match.eps, *_unit(match)), match.output)
    with graph.inserting_after(fused):
        y = new_node(graph, operator.getitem, (fused, 0), match.output)
    match.output.replace_all_uses_with(y)
    if any(user not in group for user in x.users):
        with graph.inserting_after(y):
            new_residual = new_node(graph, operator.getitem, (fused, 1), x)
        x.replace_all_uses_with(new_residual, delete_user_cb=lambda user: user not in group)
    _erase(graph, match.nodes)
    graph.erase_node(x)


class FuseAddRMSNorm(GraphPass):
    """Every RMSNorm call -> rms_norm, or add_rms_norm when a residual add feeds it."""

    name = "fuse_add_rmsnorm"
    version = 2  # 2: Gemma's norms too

    def apply(self, graph: StepGraph) -> dict[str, int]:
        counts = {"rms_norm": 0, "add_rms_norm": 0}
        for group in rmsnorm_groups(graph.graph):
            match = match_rmsnorm(group)
            if match is None:
                continue
            operands = _residual_operands(match.input)
            if operands is None:
                rewrite_rms_norm(graph.graph, match)
                counts["rms_norm"] += 1
            else:
                rewrite_add_rms_norm(graph.graph, match, *operands)
                counts["add_rms_norm"] += 1
        return counts
