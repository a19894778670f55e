"""Which graphllm ops Inductor may see through while lowering.

The fused ops that passes introduce (silu_and_mul, rms_norm, add_rms_norm) name an operation
for a hand-written kernel to take over (GPU, graphllm/kernels); fp8_quantize (quantize_fp8_activations)
is there to be fused into whatever produced its input. Where no such kernel is used,
Inductor is handed the op's PyTorch reference body instead, so it still generates one fused
loop rather than an extern call into eager PyTorch. The table is installed only while lowering.
"""

import contextlib

import torch


def fused_op_references() -> dict:
    """op overload -> its reference implementation (a traceable PyTorch function)."""
    import graphllm.ops.quantized_linear  # noqa: F401  (registers fp8_quantize)
    import graphllm.ops.rms_norm as rms_norm
    import graphllm.ops.silu_and_mul as silu_and_mul
    from graphllm.kernels.quant_layout import quantize_fp8_rows
    ops = torch.ops.graphllm
    return {ops.silu_and_mul.default: silu_and_mul.reference_silu_and_mul,
            ops.gelu_tanh_and_mul.default: silu_and_mul.reference_gelu_tanh_and_mul,
            ops.rms_norm.default: rms_norm.reference_rms_norm,
            ops.add_rms_norm.default: add_rms_norm_reference,
            ops.fp8_quantize.default: quantize_fp8_rows}


def add_rms_norm_reference(x, residual, weight, eps, unit_offset=False):
    """add_rms_norm's body: (rms_norm(x + residual), x + residual)."""
    from graphllm.kernels.reference import reference_rms_norm
    summed = x + residual
    return reference_rms_norm(summed, weight, eps, unit_offset), summed


@contextlib.contextmanager
def inductor_decompositions():
    from torch._inductor import decomposition
    added = {op: fn for op, fn in fused_op_references().items() if op not in decomposition.decompositions}
    decomposition.decompositions.update(added)
    try:
        yield
    finally:
        for op in added:
            decomposition.decompositions.pop(op, None)
