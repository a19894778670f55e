"""QuantizeFP8: linears -> W8A8 float8 linears (weights float8_e4m3fn with one scale per output
channel; activations quantized to float8 per token at run time, or with a checkpoint's static scale).

Per linear (graphllm/kernels/quant_layout.py has the layout, graphllm/ops/quantized_linear.py the op):

    before
        w: "bf16[N, K]" = get_attr <p>.weight
        y: "bf16[T, N]" = aten.linear.default(x, w, b)
    after
        w8: "f8e4m3fn[N, K]" = get_attr <p>.qweight
        ws: "f32[N]"         = get_attr <p>.weight_scale
        y:  "bf16[T, N]"     = graphllm.fp8_linear.default(x, w8, ws, None, b)   # or input_scale [1]

With `checkpoint` (a compressed-tensors FP8 checkpoint unpacked by the loader) the checkpoint's
weights and scales are used as they are; otherwise each weight is quantized here with scale
max|row| / 448. Runs before fuse_qkv / fuse_gate_up, which concatenate quantized weights too.
lm_head stays in the model dtype unless `include_lm_head`.
"""

import torch

from graphllm.ir.graph import StepGraph
from graphllm.kernels import quant_layout as Q
from graphllm.passes.base import GraphPass
from graphllm.passes.quantization.quantize_linears import Scheme, mechanism_uuid, quantize_linears


def _quantize(weight: torch.Tensor) -> dict:
    qweight, scale = Q.quantize_fp8_weight(weight)
    return {"qweight": qweight, "weight_scale": scale}


SCHEME = Scheme("fp8", torch.ops.graphllm.fp8_linear.default, ("qweight", "weight_scale", "input_scale"),
                _quantize)


class QuantizeFP8(GraphPass):
    """aten.linear -> graphllm.fp8_linear; counts {"quantized": n, "kept": n}."""

    name = "quantize_fp8"
    version = 1

    def __init__(self, include_lm_head: bool = False, checkpoint=None):
        self.include_lm_head, self.checkpoint = include_lm_head, checkpoint

    def uuid(self) -> str:
        return mechanism_uuid(super().uuid())

    def apply(self, graph: StepGraph) -> dict[str, int]:
        return quantize_linears(graph, SCHEME, self.include_lm_head, self.checkpoint)
