"""StepGraph: an fx GraphModule with its weights, plus utilities to print and diff graphs.

The weights are the GraphModule's parameters and buffers, reached by get_attr nodes, so a pass
that changes weights (concatenation, quantization, sharding) edits one object.
"""

import collections
import copy
import difflib
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import fx
from torch._guards import detect_fake_mode

SOURCE_META = ("nn_module_stack", "stack_trace")  # what inspect reads to name a node's module and line


def copy_source_meta(node: fx.Node, like: fx.Node) -> None:
    """Give node like's module path and source line (so inspect and diffs name where it came from)."""
    node.meta.update({k: like.meta[k] for k in SOURCE_META if k in like.meta})


def new_node(graph: fx.Graph, target, args: tuple, like: fx.Node) -> fx.Node:
    """A call_function node with like's module path and source line, and its fake value when known."""
    node = graph.call_function(target, args)
    copy_source_meta(node, like)
    vals = [a.meta.get("val") if isinstance(a, fx.Node) else a for a in args]
    if all(v is not None for v in vals):
        with detect_fake_mode([v for v in vals if isinstance(v, torch.Tensor)]) or nullcontext():
            node.meta["val"] = target(*vals)
    return node


def attr_tensor(gm: fx.GraphModule, node: fx.Node) -> torch.Tensor:
    """The parameter or buffer a get_attr node reads."""
    obj = gm
    for attr in node.target.split("."):
        obj = getattr(obj, attr)
    return obj


@dataclass
class StepGraph:
    gm: fx.GraphModule
    example_inputs: tuple
    dynamic_shapes: tuple

    @property
    def graph(self) -> fx.Graph:
        return self.gm.graph

    @property
    def device(self) -> torch.device:
        """The device the graph was captured for (its example inputs')."""
        return next(t.device for t in self.example_inputs if isinstance(t, torch.Tensor))

    @property
    def weights(self) -> dict[str, torch.Tensor]:
        """Every weight by every name it has; tied weights appear under each name, sharing storage."""
        named = dict(self.gm.named_parameters(remove_duplicate=False))
        named.update(self.gm.named_buffers(remove_duplicate=False))
        return {name: t.detach() for name, t in named.items()}

    def add_weight(self, name: str, tensor: torch.Tensor, like: fx.Node) -> fx.Node:
        """Register `tensor` as a parameter called `name` and return a get_attr node placed before `like`."""
        module_path, _, attr = name.rpartition(".")
        owner = self.gm.get_submodule(module_path) if module_path else self.gm
        owner.register_parameter(attr, torch.nn.Parameter(tensor, requires_grad=False))
        with self.graph.inserting_before(like):
            node = self.graph.get_attr(name)
        copy_source_meta(node, like)
        return node

    def drop_unused_weights(self) -> int:
        """Delete get_attr nodes nobody uses and the weights only they reached; returns weights dropped."""
        for node in list(self.graph.nodes):
            if node.op == "get_attr" and not node.users:
                self.graph.erase_node(node)
        used = {n.target for n in self.graph.nodes if n.op == "get_attr"}
        dropped = 0
        for name, _ in list(self.gm.named_parameters(remove_duplicate=False)):
            if name not in used:
                module_path, _, attr = name.rpartition(".")
                delattr(self.gm.get_submodule(module_path) if module_path else self.gm, attr)
                dropped += 1
        return dropped

    def recompile(self) -> None:
        self.graph.lint()
        self.gm.recompile()

    def copy_sharing_weights(self) -> "StepGraph":
        """A copy whose graph and modules are new but whose weight tensors are this graph's (passes swap
        parameters for new tensors rather than writing into them, so the copy can be rewritten alone)."""
        tensors = [t for _, t in (*self.gm.named_parameters(remove_duplicate=False),
                                  *self.gm.named_buffers(remove_duplicate=False))]
        memo = {id(t): t for t in tensors}
        return StepGraph(copy.deepcopy(self.gm, memo), self.example_inputs, self.dynamic_shapes)

    def __call__(self, *inputs):
        return self.gm(*inputs)

    def export(self) -> torch.export.ExportedProgram:
        """Re-export after passes, for lowering."""
        return torch.export.export(self.gm, self.example_inputs, dynamic_shapes=self.dynamic_shapes,
                                   strict=False)


def module_path(node: fx.Node) -> str:
    """The innermost module the node came from ('' for graph-level nodes)."""
    stack = node.meta.get("nn_module_stack") or {}
    return list(stack.values())[-1][0] if stack else ""


def op_name(node: fx.Node) -> str:
    if node.op == "call_function":
        return getattr(node.target, "__name__", str(node.target))
    return node.op


def op_counts(gm: fx.GraphModule) -> collections.Counter:
    """call_function targets by name, e.g. {'linear.default': 14, 'attention.default': 2}."""
    return collections.Counter(op_name(n) for n in gm.graph.nodes if n.op == "call_function")


def format_graph(gm: fx.GraphModule) -> str:
    """One line per node: `name = op(args)  # module.path`."""
    lines = []
    for node in gm.graph.nodes:
        text = node.format_node() or ""
        path = module_path(node)
        lines.append(f"{text}  # {path}" if path else text)
    return "\n".join(lines)


def diff_graphs(before: fx.GraphModule | str, after: fx.GraphModule | str) -> str:
    """Unified diff of two graphs' formatted text."""
    a = before if isinstance(before, str) else format_graph(before)
    b = after if isinstance(after, str) else format_graph(after)
    return "\n".join(difflib.unified_diff(a.splitlines(), b.splitlines(), "before", "after", lineterm=""))
