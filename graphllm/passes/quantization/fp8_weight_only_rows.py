"""FP8WeightOnlyRows: each fp8 linear runs weight-only (W8A16) at up to `rows` rows: x is not quantized there.

A W8A8 linear at decode batch 1 runs its activation's quantization as a kernel of its own, or fused into the
norm before it (quantize_fp8_activations): about four kernels a layer more than bf16 (0.42 ms of a 3.2 ms
batch-1 step of the 8B shape on the H200, RESULTS.md). At one row the float8 weight's bytes are the whole cost
of the matmul, and the product can take x as it is. Before and after:

    before
        qkv: "bf16[T, N]" = graphllm.fp8_linear.default(y, w8, ws, None, b)
    after
        qkv: "bf16[T, N]" = graphllm.fp8_linear.default(y, w8, ws, None, b, rows)

graphllm.fp8_linear (graphllm/ops/quantized_linear.py) then computes quant_layout.int8_linear_reference's
function over the float8 weight at up to `rows` rows (fp8_matmul's X_MODE 3) and fp8_linear_reference's (W8A8)
beyond, so the function changes at those rows only, towards the unquantized product. quantize_fp8_activations
leaves these linears whole, and linear_prologue folds the norms and SwiGLU into them, carrying `rows` along, so
that at one row each runs as one kernel, as bf16's do. Runs after the fusions (fused QKV and gate/up are single
linears by then) and before linear_prologue (CompileConfig.fp8_weight_only_rows; off at 0).
"""

import torch

import graphllm.ops.quantized_linear  # noqa: F401  (registers graphllm.fp8_linear)
from graphllm.ir.graph import StepGraph
from graphllm.passes.base import GraphPass, source_uuid

MAX_ROWS = 16  # fp8_matmul's small-M tiles, where X_MODE 3 runs


class FP8WeightOnlyRows(GraphPass):
    """fp8_linear(x, w8, ws, input_scale, bias) -> fp8_linear(..., rows); counts {"linears": n}."""

    name = "fp8_weight_only_rows"
    version = 1

    def __init__(self, rows: int):
        if not 1 <= rows <= MAX_ROWS:
            raise ValueError(f"fp8_weight_only_rows must be in 1..{MAX_ROWS} (0: off), got {rows}")
        self.rows = rows

    def uuid(self) -> str:
        return source_uuid(type(self).__module__, f"{self.name}:{self.version}:rows={self.rows}")

    def apply(self, graph: StepGraph) -> dict[str, int]:
        linears = [n for n in graph.graph.nodes
                   if n.op == "call_function" and n.target == torch.ops.graphllm.fp8_linear.default]
        for lin in linears:
            if lin.kwargs:
                raise ValueError(f"fp8_weight_only_rows: {lin.name} has keyword arguments {sorted(lin.kwargs)}")
            lin.args = (*lin.args[:5], *(None,) * (5 - len(lin.args[:5])), self.rows)
        return {"linears": len(linears)}
