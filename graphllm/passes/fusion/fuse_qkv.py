"""FuseQKV: the q, k and v projections of each attention layer become one qkv_proj linear.

One GEMM reads the activations once instead of three times. Per attention layer, with
x: [T, hidden], Hq query heads, Hkv key/value heads (GQA: Hkv <= Hq), head size D, and
optional biases (Qwen2):

    before
        q: [T, Hq*D]  = aten.linear.default(x, self_attn.q_proj.weight[Hq*D, hidden], self_attn.q_proj.bias[Hq*D])
        k: [T, Hkv*D] = aten.linear.default(x, self_attn.k_proj.weight[Hkv*D, hidden], self_attn.k_proj.bias[Hkv*D])
        v: [T, Hkv*D] = aten.linear.default(x, self_attn.v_proj.weight[Hkv*D, hidden], self_attn.v_proj.bias[Hkv*D])

    after
        qkv: [T, (Hq+2*Hkv)*D] = aten.linear.default(x, self_attn.qkv_proj.weight[(Hq+2*Hkv)*D, hidden],
                                                     self_attn.qkv_proj.bias[(Hq+2*Hkv)*D])
        parts = aten.split_with_sizes.default(qkv, [Hq*D, Hkv*D, Hkv*D], -1)
        q: [T, Hq*D], k: [T, Hkv*D], v: [T, Hkv*D] = parts[0], parts[1], parts[2]

Everything downstream (views, q/k norm, rotary, attention) reads q, k, v unchanged. The
matching rules (same input, sibling names, no tied weights) live in linear_siblings.
"""

from graphllm.ir.graph import StepGraph
from graphllm.passes.base import GraphPass
from graphllm.passes.fusion.linear_siblings import fuse_sibling_linears, mechanism_uuid

MEMBERS = ("q_proj", "k_proj", "v_proj")


class FuseQKV(GraphPass):
    """q_proj, k_proj, v_proj -> qkv_proj + split_with_sizes; counts {"fused": groups merged}."""

    name = "fuse_qkv"
    version = 1

    def uuid(self) -> str:
        return mechanism_uuid(super().uuid())

    def apply(self, graph: StepGraph) -> dict[str, int]:
        return {"fused": fuse_sibling_linears(graph, MEMBERS, "qkv_proj")}
