"""QuantizeInt4: linears -> weight-only int4 linears, asymmetric, one scale and zero per group of G
input columns (G = 128 by default, `CompileConfig.quantization_group_size`).

Per linear (graphllm/kernels/quant_layout.py has the layout, graphllm/ops/quantized_linear.py the op):

    before
        w: "bf16[N, K]" = get_attr <p>.weight
        y: "bf16[T, N]" = aten.linear.default(x, w, b)
    after
        qw: "i32[K/8, N]"  = get_attr <p>.qweight        # GPTQ's packing, 8 nibbles per word
        s:  "bf16[K/G, N]" = get_attr <p>.scales
        z:  "bf16[K/G, N]" = get_attr <p>.zeros
        y:  "bf16[T, N]"   = graphllm.int4_linear.default(x, qw, s, z, b)

A weight whose input width K is not a multiple of G stays in the model dtype, with a log line
(counted as "kept"). With `checkpoint` (GPTQ, AWQ or compressed-tensors W4A16 unpacked by the
loader into this layout) the checkpoint's tensors are used as they are. Runs before fuse_qkv /
fuse_gate_up, which concatenate quantized weights too. lm_head stays unquantized unless
`include_lm_head`.
"""

import torch

from graphllm.ir.graph import StepGraph
from graphllm.kernels import quant_layout as Q
from graphllm.passes.base import GraphPass
from graphllm.passes.quantization.quantize_linears import Scheme, mechanism_uuid, quantize_linears


def int4_scheme(group_size: int) -> Scheme:
    def quantize(weight: torch.Tensor) -> dict:
        qweight, scales, zeros = Q.quantize_int4_weight(weight, group_size)
        return {"qweight": qweight, "scales": scales, "zeros": zeros}

    def cannot_hold(weight: torch.Tensor) -> str | None:
        k = weight.shape[1]
        return None if k % group_size == 0 else f"its input width {k} is not a multiple of the group size {group_size}"

    return Scheme("int4", torch.ops.graphllm.int4_linear.default, ("qweight", "scales", "zeros"), quantize,
                  cannot_hold)


class QuantizeInt4(GraphPass):
    """aten.linear -> graphllm.int4_linear; counts {"quantized": n, "kept": n}."""

    name = "quantize_int4"
    version = 1

    def __init__(self, group_size: int = 128, include_lm_head: bool = False, checkpoint=None):
        if group_size < 8 or group_size % 8:
            raise ValueError(f"int4 group size must be a positive multiple of 8, got {group_size}")
        self.group_size, self.include_lm_head, self.checkpoint = group_size, include_lm_head, checkpoint

    def uuid(self) -> str:
        return mechanism_uuid(super().uuid())

    def apply(self, graph: StepGraph) -> dict[str, int]:
        return quantize_linears(graph, int4_scheme(self.group_size), self.include_lm_head, self.checkpoint)
