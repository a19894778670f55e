"""Sibling linears: merge linears that read the same input into one linear over concatenated weights.

The mechanism behind fuse_qkv and fuse_gate_up. A group is one linear per requested member, all of
one kind (`aten.linear.default` or a quantized linear of graphllm/ops/quantized_linear.py: `KINDS`),
all reading the same input node, whose first weight operands are get_attr nodes named
`<prefix>.<member>.<attr>` under one parent module `<prefix>` (members q_proj, k_proj, v_proj
under `model.model.layers.0.self_attn`, say). Each group becomes (aten.linear shown; a quantized
linear concatenates each of its weight operands along its output dimension the same way: int4's
qweight/scales/zeros along dim 1, fp8/int8 weights and scales along dim 0):

    before                                           after
    a = aten.linear(x, <p>.a.weight, <p>.a.bias)     w = get_attr <p>.<fused>.weight  # cat([Wa, Wb], 0)
    b = aten.linear(x, <p>.b.weight)                 b_ = get_attr <p>.<fused>.bias   # cat([ba, zeros(Nb)])
                                                     y = aten.linear(x, w, b_)        # [T, Na + Nb]
                                                     s = aten.split_with_sizes(y, [Na, Nb], -1)
                                                     a, b = getitem(s, 0), getitem(s, 1)

Split sizes follow the member order given, not graph order. A bias is emitted when any member
has one (zeros stand in for the missing ones). fp8's static input scale is one operand shared by
the fused linear: the members' scales are equal in practice (they observe the same input) and the
largest is kept, as vLLM does. A group is skipped when a member is missing or appears twice, when
members are of different kinds, when a weight or bias has another user or is tied to another name,
when a bias is not a plain weight, when weights disagree on their other dimensions/dtype/device, when
some members have a static input scale and others not, or when the parent already has an attribute
called `<fused>`. Old weights are dropped afterwards.

Meta: the new get_attr/linear/split nodes take `stack_trace` and `nn_module_stack` from the
first merged linear in graph order, its innermost stack entry renamed to `<p>.<fused>` so
`module_path` names the fused module; each getitem keeps the meta of the linear it replaces.
"""

import operator
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import fx, nn
from torch._guards import detect_fake_mode

import graphllm.ops.quantized_linear  # noqa: F401  (registers the quantized linears, KINDS below)
from graphllm.ir.graph import StepGraph, attr_tensor, copy_source_meta
from graphllm.passes.base import source_uuid

LINEAR = torch.ops.aten.linear.default
SPLIT = torch.ops.aten.split_with_sizes.default


@dataclass(frozen=True)
class LinearKind:
    """Where a linear op keeps its operands: args[0] is the input."""
    weights: tuple[tuple[int, int], ...]  # (argument index, output dim) per weight operand; the first names the module
    bias: int                             # argument index of the bias
    shared: int | None = None             # argument index of an operand every member shares (fp8's input scale)


KINDS = {
    LINEAR: LinearKind(((1, 0),), bias=2),
    torch.ops.graphllm.fp8_linear.default: LinearKind(((1, 0), (2, 0)), bias=4, shared=3),
    torch.ops.graphllm.int8_linear.default: LinearKind(((1, 0), (2, 0)), bias=3),
    torch.ops.graphllm.int4_linear.default: LinearKind(((1, 1), (2, 1), (3, 1)), bias=4),
}


@dataclass(frozen=True)
class LinearGroup:
    """Sibling linears to merge: `linears[i]` is member i of the requested members."""
    prefix: str                   # the parent module's path, e.g. "model.model.layers.0.mlp"
    linears: tuple[fx.Node, ...]  # linear nodes of one kind, in member order


def fuse_sibling_linears(graph: StepGraph, members: Sequence[str], fused: str) -> int:
    """Merge every group of `members` siblings into one `<prefix>.<fused>` linear; returns groups merged."""
    groups = [g for g in find_sibling_linears(graph, members)
              if not hasattr(graph.gm.get_submodule(g.prefix), fused)]
    for group in groups:
        merge_sibling_linears(graph, group, fused)
    if groups:
        graph.drop_unused_weights()
    return len(groups)


def find_sibling_linears(graph: StepGraph, members: Sequence[str]) -> list[LinearGroup]:
    """Every complete, mergeable group of `members` siblings, in graph order."""
    shared = _shared_tensor_ids(graph.gm)
    found = defaultdict(lambda: defaultdict(list))  # (input, prefix) -> member -> [linear]
    for node in graph.graph.nodes:
        sibling = _sibling_of(node, members)
        if sibling and _owns_operands(graph.gm, node, shared):
            found[(node.args[0], sibling[0])][sibling[1]].append(node)
    groups = []
    for (_, prefix), by_member in found.items():
        if all(len(by_member[m]) == 1 for m in members):
            group = LinearGroup(prefix, tuple(by_member[m][0] for m in members))
            if _compatible(graph.gm, group):
                groups.append(group)
    return groups


def merge_sibling_linears(graph: StepGraph, group: LinearGroup, fused: str) -> fx.Node:
    """Replace the group by one linear, a split_with_sizes and getitems; returns the split node."""
    members = set(group.linears)
    first = next(n for n in graph.graph.nodes if n in members)  # users of every member come after it
    args, sizes = _fused_operands(graph, group, fused, first)
    params = [a for a in args if isinstance(a, fx.Node)]
    with graph.graph.inserting_before(first):
        out = graph.graph.call_function(first.target, (first.args[0], *args))
        split = graph.graph.call_function(SPLIT, (out, sizes, -1))
        parts = [graph.graph.call_function(operator.getitem, (split, i)) for i in range(len(sizes))]
    _copy_meta(first, f"{group.prefix}.{fused}", [*params, out, split])
    _set_vals(graph.gm, group, params, out, split, parts)
    for old, part in zip(group.linears, parts):
        copy_source_meta(part, old)
        old.replace_all_uses_with(part)
        graph.graph.erase_node(old)
    return split


def mechanism_uuid(pass_uuid: str) -> str:
    """A pass's uuid mixed with this module's source, so editing the shared mechanism invalidates artifacts."""
    return source_uuid(__name__, pass_uuid)


def _arg(node: fx.Node, index: int):
    return node.args[index] if len(node.args) > index else None


def _operand_nodes(node: fx.Node) -> list:
    """The weight operands, the shared operand and the bias of a linear node (None where absent)."""
    kind = KINDS[node.target]
    nodes = [_arg(node, i) for i, _ in kind.weights]
    return nodes + [None if kind.shared is None else _arg(node, kind.shared), _arg(node, kind.bias)]


def _sibling_of(node: fx.Node, members: Sequence[str]) -> tuple[str, str] | None:
    """(prefix, member) when `node` is a linear whose first weight is `<prefix>.<member>.<attr>`, else None."""
    if node.op != "call_function" or node.target not in KINDS or node.kwargs:
        return None
    if len(node.args) <= KINDS[node.target].weights[-1][0]:
        return None
    weight = node.args[KINDS[node.target].weights[0][0]]
    if not isinstance(weight, fx.Node) or weight.op != "get_attr":
        return None
    prefix, _, member = weight.target.rpartition(".")[0].rpartition(".")
    return (prefix, member) if prefix and member in members else None


def _owns_operands(gm: fx.GraphModule, node: fx.Node, shared: set[int]) -> bool:
    """The linear is the only user of its weights (and bias), and none is tied to another name."""
    params = [p for p in _operand_nodes(node) if p is not None]
    return all(isinstance(p, fx.Node) and p.op == "get_attr" and len(p.users) == 1
               and id(attr_tensor(gm, p)) not in shared for p in params)


def _shared_tensor_ids(gm: fx.GraphModule) -> set[int]:
    """ids of tensors reached by more than one get_attr node (tied weights)."""
    seen, shared = set(), set()
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            key = id(attr_tensor(gm, node))
            (shared if key in seen else seen).add(key)
    return shared


def _compatible(gm: fx.GraphModule, group: LinearGroup) -> bool:
    """One kind; each weight operand agrees on its other dims, dtype and device; biases match N;
    a shared operand is present in every member or in none."""
    if len({n.target for n in group.linears}) != 1:
        return False
    kind = KINDS[group.linears[0].target]
    for j, (_, dim) in enumerate(kind.weights):
        ts = [attr_tensor(gm, _operand_nodes(n)[j]) for n in group.linears]
        if any((j == 0 and t.dim() != 2) or t.dim() <= dim for t in ts):  # the first is the [N, K]-like weight
            return False
        if len({(t.shape[:dim] + t.shape[dim + 1:], t.dtype, t.device) for t in ts}) != 1:
            return False
    if len({_operand_nodes(n)[-2] is None for n in group.linears}) != 1:
        return False
    for node, n_out in zip(group.linears, _output_sizes(gm, group)):
        bias = _operand_nodes(node)[-1]
        if bias is not None and attr_tensor(gm, bias).shape != (n_out,):
            return False
    return True


def _output_sizes(gm: fx.GraphModule, group: LinearGroup) -> list[int]:
    index, dim = KINDS[group.linears[0].target].weights[0]
    return [attr_tensor(gm, n.args[index]).shape[dim] for n in group.linears]


def _fused_operands(graph: StepGraph, group: LinearGroup, fused: str, first: fx.Node) -> tuple[list, list[int]]:
    """The fused linear's arguments after its input (new get_attr nodes, None where absent), and the
    split sizes [N_i]. Weights concatenate along their output dim; zeros stand in for missing biases."""
    gm, kind = graph.gm, KINDS[first.target]
    _ensure_module(gm, f"{group.prefix}.{fused}")
    sizes = _output_sizes(gm, group)
    args: list = [None] * max(kind.bias, kind.shared or 0)

    def add(index: int, source: fx.Node, tensor: torch.Tensor) -> None:
        attr = source.target.rpartition(".")[2]
        args[index - 1] = graph.add_weight(f"{group.prefix}.{fused}.{attr}", tensor, like=first)

    for index, dim in kind.weights:
        add(index, first.args[index], torch.cat([attr_tensor(gm, n.args[index]) for n in group.linears], dim=dim))
    if kind.shared is not None and _arg(first, kind.shared) is not None:
        scales = [attr_tensor(gm, n.args[kind.shared]) for n in group.linears]
        add(kind.shared, first.args[kind.shared], torch.stack(scales).amax(dim=0))
    biases = [_arg(n, kind.bias) for n in group.linears]
    present = [b for b in biases if b is not None]
    if present:
        like = attr_tensor(gm, present[0])
        parts = [attr_tensor(gm, b) if b is not None else like.new_zeros(n) for b, n in zip(biases, sizes)]
        add(kind.bias, present[0], torch.cat([p.to(like.dtype) for p in parts]))
    while args and args[-1] is None:  # aten.linear(x, w), not aten.linear(x, w, None)
        args.pop()
    return args, sizes


def _ensure_module(gm: fx.GraphModule, path: str) -> None:
    """Create an empty container module at `path` so add_weight can register parameters on it."""
    parent, _, name = path.rpartition(".")
    owner = gm.get_submodule(parent)
    if not hasattr(owner, name):
        owner.add_module(name, nn.Module())


def _copy_meta(source: fx.Node, fused_path: str, nodes: list[fx.Node]) -> None:
    """Source line and module stack of `source`, with its innermost module renamed to `fused_path`."""
    meta = {k: source.meta[k] for k in ("stack_trace",) if k in source.meta}
    stack = dict(source.meta.get("nn_module_stack") or {})
    if stack:
        key, (path, _) = stack.popitem()
        stack[key.replace(path, fused_path)] = (fused_path, "torch.nn.modules.linear.Linear")
        meta["nn_module_stack"] = stack
    for node in nodes:
        node.meta.update(meta)


def _set_vals(gm: fx.GraphModule, group: LinearGroup, params: list[fx.Node], out: fx.Node,
              split: fx.Node, parts: list[fx.Node]) -> None:
    """Fake-tensor `val` metadata for the new nodes, when the old ones carry it."""
    vals = [n.meta.get("val") for n in group.linears]
    fake_mode = detect_fake_mode(vals) if all(v is not None for v in vals) else None
    if fake_mode is None:
        return
    with fake_mode:
        out.meta["val"] = torch.cat(vals, dim=-1)  # [T, sum N_i]
    for param in params:
        param.meta["val"] = fake_mode.from_tensor(attr_tensor(gm, param).detach(), static_shapes=True)
    split.meta["val"] = list(vals)
    for part, val in zip(parts, vals):
        part.meta["val"] = val
