"""FuseGateUp: the gate and up projections of each MLP become one gate_up_proj linear.

One GEMM reads the activations once instead of twice. Per MLP, with x: [T, hidden] and
intermediate size I:

    before
        gate: [T, I] = aten.linear.default(x, mlp.gate_proj.weight[I, hidden])
        up:   [T, I] = aten.linear.default(x, mlp.up_proj.weight[I, hidden])
        h:    [T, I] = aten.mul.Tensor(aten.silu.default(gate), up)

    after
        gate_up: [T, 2*I] = aten.linear.default(x, mlp.gate_up_proj.weight[2*I, hidden])  # gate rows first
        parts = aten.split_with_sizes.default(gate_up, [I, I], -1)
        h:       [T, I]   = aten.mul.Tensor(aten.silu.default(parts[0]), parts[1])

The form is a contract: fuse_silu_mul matches
`mul(silu(getitem(split_with_sizes(t, [I, I], -1), 0)), getitem(same split, 1))`, so the output
is exactly one split_with_sizes node with two getitem users, gate first. The matching rules
(same input, sibling names, no tied weights) live in linear_siblings.
"""

from graphllm.ir.graph import StepGraph
from graphllm.passes.base import GraphPass
from graphllm.passes.fusion.linear_siblings import fuse_sibling_linears, mechanism_uuid

MEMBERS = ("gate_proj", "up_proj")


class FuseGateUp(GraphPass):
    """gate_proj, up_proj -> gate_up_proj + split_with_sizes; counts {"fused": groups merged}."""

    name = "fuse_gate_up"
    version = 1

    def uuid(self) -> str:
        return mechanism_uuid(super().uuid())

    def apply(self, graph: StepGraph) -> dict[str, int]:
        return {"fused": fuse_sibling_linears(graph, MEMBERS, "gate_up_proj")}
