"""Sibling linears: merge linears that read the same input into one linear over concatenated weights.

The mechanism behind fuse_qkv and fuse_gate_up. A group is one `aten.linear.default` per
requested member, all reading the same input node, whose weights are get_attr nodes named
`<prefix>.<member>.weight` under one parent module `<prefix>` (members q_proj, k_proj, v_proj
under `model.model.layers.0.self_attn`, say). Each group becomes:

    before                                           after
    a = aten.linear(x, <p>.a.weight, <p>.a.bias)     w = get_attr <p>.<fused>.weight  # cat([Wa, Wb], 0)
    b = aten.linear(x, <p>.b.weight)                 b_ = get_attr <p>.<fused>.bias   # cat([ba, zeros(Nb)])
                                                     y = aten.linear(x, w, b_)        # [T, Na + Nb]
                                                     s = aten.split_with_sizes(y, [Na, Nb], -1)
                                                     a, b = getitem(s, 0), getitem(s, 1)

Split sizes follow the member order given, not graph order. A bias is emitted when any member
has one (zeros stand in for the missing ones). A group is skipped when a member is missing or
appears twice, when a weight or bias has another user or is tied to another name, when a bias
is not a plain weight, when weights disagree on input width/dtype/device, or when the parent
already has an attribute called `<fused>`. Old weights are dropped afterwards.

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

from graphllm.ir.graph import StepGraph, copy_source_meta
from graphllm.passes.base import source_uuid

LINEAR = torch.ops.aten.linear.default
SPLIT = torch.ops.aten.split_with_sizes.default


@dataclass(frozen=True)
class LinearGroup:
    """Sibling linears to merge: `linears[i]` is member i of the requested members."""
    prefix: str                   # the parent module's path, e.g. "model.model.layers.0.mlp"
    linears: tuple[fx.Node, ...]  # aten.linear nodes, in member order


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
    weight, bias, sizes = _concat_weights(graph.gm, group)
    _ensure_module(graph.gm, f"{group.prefix}.{fused}")
    params = [graph.add_weight(f"{group.prefix}.{fused}.weight", weight, like=first)]
    if bias is not None:
        params.append(graph.add_weight(f"{group.prefix}.{fused}.bias", bias, like=first))
    with graph.graph.inserting_before(first):
        out = graph.graph.call_function(LINEAR, (first.args[0], *params))
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


def _operands(node: fx.Node) -> tuple:
    """(input, weight, bias or None) of an aten.linear node."""
    x, weight, *rest = node.args
    return x, weight, rest[0] if rest else node.kwargs.get("bias")


def _sibling_of(node: fx.Node, members: Sequence[str]) -> tuple[str, str] | None:
    """(prefix, member) when `node` is a linear over `<prefix>.<member>.weight`, else None."""
    if node.op != "call_function" or node.target is not LINEAR or len(node.args) < 2:
        return None
    weight = node.args[1]
    if not isinstance(weight, fx.Node) or weight.op != "get_attr" or not weight.target.endswith(".weight"):
        return None
    prefix, _, member = weight.target[:-len(".weight")].rpartition(".")
    return (prefix, member) if prefix and member in members else None


def _owns_operands(gm: fx.GraphModule, node: fx.Node, shared: set[int]) -> bool:
    """The linear is the only user of its weight (and bias), and neither is tied to another name."""
    _, weight, bias = _operands(node)
    params = [weight] if bias is None else [weight, bias]
    return all(isinstance(p, fx.Node) and p.op == "get_attr" and len(p.users) == 1
               and id(_tensor(gm, p)) not in shared for p in params)


def _shared_tensor_ids(gm: fx.GraphModule) -> set[int]:
    """ids of tensors reached by more than one get_attr node (tied weights)."""
    seen, shared = set(), set()
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            key = id(_tensor(gm, node))
            (shared if key in seen else seen).add(key)
    return shared


def _compatible(gm: fx.GraphModule, group: LinearGroup) -> bool:
    """Weights are 2-D and agree on input width, dtype and device; biases are 1-D of matching length."""
    weights = [_tensor(gm, _operands(n)[1]) for n in group.linears]
    if any(w.dim() != 2 for w in weights):
        return False
    if len({(w.shape[1], w.dtype, w.device) for w in weights}) != 1:
        return False
    for node, w in zip(group.linears, weights):
        bias = _operands(node)[2]
        if bias is not None and _tensor(gm, bias).shape != (w.shape[0],):
            return False
    return True


def _concat_weights(gm: fx.GraphModule, group: LinearGroup) -> tuple:
    """([sum N_i, K] weight, [sum N_i] bias or None, [N_i]); zeros stand in for missing biases."""
    weights = [_tensor(gm, _operands(n)[1]) for n in group.linears]
    biases = [_operands(n)[2] for n in group.linears]
    weight, sizes = torch.cat(weights, dim=0), [w.shape[0] for w in weights]
    if all(b is None for b in biases):
        return weight, None, sizes
    parts = [_tensor(gm, b).to(w.dtype) if b is not None else w.new_zeros(w.shape[0])
             for w, b in zip(weights, biases)]
    return weight, torch.cat(parts), sizes


def _tensor(gm: fx.GraphModule, node: fx.Node) -> torch.Tensor:
    obj = gm
    for attr in node.target.split("."):
        obj = getattr(obj, attr)
    return obj


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
        param.meta["val"] = fake_mode.from_tensor(_tensor(gm, param).detach(), static_shapes=True)
    split.meta["val"] = list(vals)
    for part, val in zip(parts, vals):
        part.meta["val"] = val
