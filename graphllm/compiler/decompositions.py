"""Which graphllm ops Inductor may see through while lowering.

The fused ops that passes introduce (silu_and_mul, rms_norm, add_rms_norm) name an operation
for a hand-written kernel to take over (GPU, graphllm/kernels); fp8_quantize (quantize_fp8_activations)
is there to be fused into whatever produced its input. Where no such kernel is used,
Inductor is handed the op's PyTorch reference body instead, so it still generates one fused
loop rather than an extern call into eager PyTorch. The table is installed only while lowering.

While lowering, the schemas of graphllm's ops are in the key of Inductor's own caches too (op_schemas_tag):
Inductor writes every argument of an extern op call, defaults included, into its code, but keys its FX graph
cache on the graph, where defaults do not appear. A schema change (an argument added or removed) then reused
code that calls the op as it was: a removed `prefetch=None` failed every step with a warm cache (2026-12-02).
"""

import contextlib
import hashlib

import torch

OP_MODULES = ("attention", "collectives", "linear", "mla_attention", "moe", "quantized_linear", "rms_norm",
              "silu_and_mul")  # graphllm/ops: every module that registers ops


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


def op_schemas_tag() -> str:
    """A digest of every graphllm op's schema (all of graphllm/ops registered first, so the set is always whole)."""
    import importlib
    for name in OP_MODULES:
        importlib.import_module(f"graphllm.ops.{name}")
    schemas = sorted(str(s) for s in torch._C._jit_get_all_schemas() if s.name.startswith("graphllm::"))
    return "graphllm-ops-" + hashlib.sha256("\n".join(schemas).encode()).hexdigest()[:16]


@contextlib.contextmanager
def inductor_decompositions():
    """The fused ops' references as Inductor decompositions, and op_schemas_tag in Inductor's cache keys (beside
    any tag of the user's: torch.compiler.config.cache_key_tag, where this torch has it)."""
    from torch._inductor import decomposition
    added = {op: fn for op, fn in fused_op_references().items() if op not in decomposition.decompositions}
    decomposition.decompositions.update(added)
    compiler_config = torch.compiler.config
    tagged = contextlib.nullcontext()
    if hasattr(compiler_config, "cache_key_tag"):
        tag = ":".join(t for t in (compiler_config.cache_key_tag, op_schemas_tag()) if t)
        tagged = compiler_config.patch(cache_key_tag=tag)
    try:
        with tagged:
            yield
    finally:
        for op in added:
            decomposition.decompositions.pop(op, None)
