"""QuantizeInt8: linears -> weight-only int8 linears (symmetric, one scale per output channel).

Per linear (graphllm/kernels/quant_layout.py has the layout, graphllm/ops/quantized_linear.py the op):

    before
        w: "bf16[N, K]" = get_attr <p>.weight
        y: "bf16[T, N]" = aten.linear.default(x, w, b)
    after
        w8: "i8[N, K]"   = get_attr <p>.qweight
        ws: "f32[N]"     = get_attr <p>.weight_scale      # max|row| / 127
        y:  "bf16[T, N]" = graphllm.int8_linear.default(x, w8, ws, b)

Activations stay in the model dtype. Runs before fuse_qkv / fuse_gate_up, which concatenate
quantized weights too. lm_head stays in the model dtype unless `include_lm_head`.
"""

import torch

from graphllm.ir.graph import StepGraph
from graphllm.kernels import quant_layout as Q
from graphllm.passes.base import GraphPass
from graphllm.passes.quantization.quantize_linears import Scheme, mechanism_uuid, quantize_linears


def _quantize(weight: torch.Tensor) -> dict:
    qweight, scale = Q.quantize_int8_weight(weight)
    return {"qweight": qweight, "weight_scale": scale}


SCHEME = Scheme("int8", torch.ops.graphllm.int8_linear.default, ("qweight", "weight_scale"), _quantize)


class QuantizeInt8(GraphPass):
    """aten.linear -> graphllm.int8_linear; counts {"quantized": n, "kept": n}."""

    name = "quantize_int8"
    version = 1

    def __init__(self, include_lm_head: bool = False):
        self.include_lm_head = include_lm_head

    def uuid(self) -> str:
        return mechanism_uuid(super().uuid())

    def apply(self, graph: StepGraph) -> dict[str, int]:
        return quantize_linears(graph, SCHEME, self.include_lm_head, None)
