"""EliminateNoops: drop casts, asserts, views and copies that leave their input unchanged.

Export's training IR keeps every `.to()` of the model together with the
`_assert_tensor_metadata` it inserts for it; in a float32 graph RMSNorm's and rope's casts
are float32 -> float32. Facts come from `node.meta["val"]` (FakeTensors with symbolic sizes)
and a rewrite happens only when the facts provably hold for every size:

    before                                              after
    _assert_tensor_metadata(mul_1, dtype=f32, ...)      (gone: mul_1 is f32 on that device)
    to_4: f32[T, 64] = to.dtype(mul_1, f32)             (gone)
    mul_2 = mul(w, to_4)                                mul_2 = mul(w, mul_1)

    v: f32[T, 64] = view(x: f32[T, 64], [T, -1])        (gone: same shape; users read x)
    a = view(x, [T, 4, 16]); b = view(a, [T, 64])       b = view(x, [T, 64])   (a had one user)
    c: f32[T, 64] = clone(x)   # x contiguous           (gone, unless c or x is mutated or returned)

Kept: real casts (bf16 -> f32 in RMSNorm and rope), asserts that meta cannot confirm, and
copies whose storage is written (add_, the attention op's kv_cache) or that reach the output.
Counts: {"cast": removed to/_to_copy, "assert": asserts, "view": view nodes removed (identity
or folded into a chain), "clone": clone/contiguous}.
"""

import operator

import torch
from torch import fx
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch.utils import _pytree as pytree

from graphllm.ir.graph import StepGraph
from graphllm.passes.base import GraphPass

aten = torch.ops.aten
CASTS = {aten.to.dtype, aten.to.dtype_layout, aten.to.device, aten._to_copy.default}
VIEWS = {aten.view.default, aten.reshape.default, aten._unsafe_view.default}
PURE_VIEWS = {aten.view.default, aten._unsafe_view.default}  # never copy, unlike reshape
COPIES = {aten.clone.default, aten.contiguous.default}
KEEP_LAYOUT = (None, torch.preserve_format, torch.contiguous_format)


class EliminateNoops(GraphPass):
    name = "eliminate_noops"

    def apply(self, graph: StepGraph) -> dict[str, int]:
        storage = StorageFacts(graph.graph)
        counts = dict.fromkeys(("cast", "assert", "view", "clone"), 0)
        for node in list(graph.graph.nodes):
            if node.op != "call_function":
                continue
            if node.target is aten._assert_tensor_metadata.default and assert_holds(node):
                graph.graph.erase_node(node)
                counts["assert"] += 1
            elif node.target in CASTS and cast_is_noop(node, storage):
                counts["cast"] += replace_by_input(node)
            elif node.target in VIEWS:
                counts["view"] += fold_view_chain(node) + drop_identity_view(node)
            elif node.target in COPIES and copy_is_noop(node, storage):
                counts["clone"] += replace_by_input(node)
        return counts


def replace_by_input(node: fx.Node) -> int:
    node.replace_all_uses_with(node.args[0])
    node.graph.erase_node(node)
    return 1


def assert_holds(node: fx.Node) -> bool:
    """Every field the assert checks (size, stride, dtype, device, layout) matches the input's meta."""
    val = tensor_val(node.args[0])
    fields = {name: value for name, value in bound_args(node).items() if value is not None}
    checked = {name: value for name, value in fields.items() if name != "a"}  # a: the tensor itself
    return val is not None and all(field_matches(val, name, value) for name, value in checked.items())


def field_matches(val: torch.Tensor, name: str, value) -> bool:
    if name in ("size", "stride"):  # entries may be sym_size nodes: compare their SymInts
        sizes = [v.meta.get("val") if isinstance(v, fx.Node) else v for v in value]
        return known_equal_sizes(sizes, val.shape if name == "size" else val.stride())
    if name == "device":
        return torch.device(value) == val.device
    return name in ("dtype", "layout") and value == getattr(val, name)


def cast_is_noop(node: fx.Node, storage: "StorageFacts") -> bool:
    """The result has the input's dtype, device, layout, sizes and strides; a forced copy must be unobserved."""
    src, out = tensor_val(node.args[0]), tensor_val(node)
    if src is None or out is None or (src.dtype, src.device, src.layout) != (out.dtype, out.device, out.layout):
        return False
    if not (known_equal_sizes(src.shape, out.shape) and known_equal_sizes(src.stride(), out.stride())):
        return False
    copies = node.target is aten._to_copy.default or bound_args(node).get("copy", False)
    return not copies or storage.copy_is_unobserved(node)


def fold_view_chain(node: fx.Node) -> int:
    """view(view(x, a), b) -> view(x, b) when the inner view has no other user; returns views removed."""
    inner = node.args[0]
    if not (isinstance(inner, fx.Node) and inner.op == "call_function" and inner.target in PURE_VIEWS
            and len(inner.users) == 1):
        return 0
    node.args = (inner.args[0], *node.args[1:])
    node.graph.erase_node(inner)
    return 1


def drop_identity_view(node: fx.Node) -> int:
    """A view/reshape whose output shape is its input's shape is its input; returns views removed."""
    src, out = tensor_val(node.args[0]), tensor_val(node)
    if src is None or out is None or not known_equal_sizes(src.shape, out.shape):
        return 0
    return replace_by_input(node)


def copy_is_noop(node: fx.Node, storage: "StorageFacts") -> bool:
    """clone/contiguous of a contiguous input in a layout that keeps it; clone's copy must be unobserved."""
    src, out = tensor_val(node.args[0]), tensor_val(node)
    if src is None or out is None or bound_args(node).get("memory_format") not in KEEP_LAYOUT:
        return False
    if not (is_contiguous(src) and known_equal_sizes(src.stride(), out.stride())):
        return False
    return node.target is aten.contiguous.default or storage.copy_is_unobserved(node)


class StorageFacts:
    """Which storages a graph writes or returns, to tell when dropping a copy could be observed.

    A node's storage is found by walking back through ops whose schema says the result aliases
    `self` (view, reshape, to, add_, chunk ...); `_unsafe_view` and getitem alias too. A callee
    without a schema (export's `_guards_fn` module, a Python function) counts as writing its
    inputs, so copies of step inputs stay.
    """

    def __init__(self, graph: fx.Graph):
        self.written, self.returned = set(), set()
        for node in graph.nodes:
            if node.op == "output":
                self.returned.update(self.root(n) for n in pytree.tree_leaves(node.args) if isinstance(n, fx.Node))
            elif node.op in ("call_function", "call_module", "call_method"):
                self.written.update(self.root(n) for n in written_inputs(node))

    def root(self, node: fx.Node) -> fx.Node:
        while aliases_first_arg(node):
            node = node.args[0]
        return node

    def copy_is_unobserved(self, copy: fx.Node) -> bool:
        """Neither the copy's storage nor its source's is written or returned anywhere in the graph."""
        seen = self.written | self.returned
        return copy not in seen and self.root(copy.args[0]) not in seen


def aliases_first_arg(node: fx.Node) -> bool:
    if node.op != "call_function" or not node.args or not isinstance(node.args[0], fx.Node):
        return False
    if node.target in (aten._unsafe_view.default, operator.getitem):
        return True
    schema = getattr(node.target, "_schema", None)
    return (isinstance(node.target, torch._ops.OpOverload) and bool(schema.returns) and bool(schema.arguments)
            and schema.returns[0].alias_info is not None and schema.arguments[0].alias_info is not None)


def written_inputs(node: fx.Node) -> list[fx.Node]:
    """Inputs the node may write: per the schema for aten/custom ops; every input for anything else."""
    if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
        args = bound_args(node)
        values = [args.get(a.name) for a in node.target._schema.arguments if a.alias_info and a.alias_info.is_write]
    elif node.op == "call_function" and aliases_first_arg(node):
        values = []  # getitem reads
    else:
        values = [node.args, node.kwargs]  # unknown callee: assume the worst
    return [n for n in pytree.tree_leaves(values) if isinstance(n, fx.Node)]


def bound_args(node: fx.Node) -> dict:
    """Schema argument name -> value given at this call (positional and keyword); {} without a schema."""
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return {}
    named = {a.name: value for a, value in zip(schema.arguments, node.args)}
    named.update(node.kwargs)
    return named


def tensor_val(node) -> torch.Tensor | None:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return val if isinstance(val, torch.Tensor) else None


def known_equal_sizes(a, b) -> bool:
    """Equal for every value the symbols may take (unknown counts as different)."""
    return len(a) == len(b) and all(statically_known_true(x == y) for x, y in zip(a, b))


def is_contiguous(val: torch.Tensor) -> bool:
    """Row-major strides, provably (stricter than Tensor.is_contiguous on size-1 dims)."""
    expected, step = [], 1
    for size in reversed(val.shape):
        expected.append(step)
        step = step * size
    return known_equal_sizes(val.stride(), expected[::-1])
