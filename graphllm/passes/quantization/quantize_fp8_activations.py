"""QuantizeFP8Activations: each fp8 linear's activation quantization becomes a graph node of its own, so
Inductor fuses it into the kernel that produced the activation (the RMSNorm, SiLU·mul, residual add).

Before, `graphllm.fp8_linear` quantizes x inside the op: at decode sizes its kernel reads the rows for
max|x| (or a quantize kernel of its own runs first), past 16 rows a per-row quantize kernel runs before
torch._scaled_mm. After, per distinct (x, input_scale) pair:

    before
        y:   "bf16[T, H]" = <norm, SiLU·mul or anything>
        qkv: "bf16[T, N]" = graphllm.fp8_linear.default(y, w8, ws, None, b)
    after
        q = graphllm.fp8_quantize.default(y, None)           # (f8e4m3fn [T, H], f32 [T, 1]); or input_scale
        yq = getitem(q, 0)
        ys = getitem(q, 1)
        qkv: "bf16[T, N]" = graphllm.fp8_linear_quantized.default(yq, ys, w8, ws, b, torch.bfloat16)

Linears that read the same x with the same scale (unfused q/k/v) share one quantization. Inductor lowers
fp8_quantize from its reference (graphllm/compiler/decompositions.py), so the norm's kernel writes float8
and the scales instead of the bf16 row; fp8_linear_quantized is opaque, like fp8_linear (its kernel or
row-wise _scaled_mm). Where x is a SwiGLU read only by such linears, graphllm.silu_and_mul_fp8(gate_up)
takes the place of both (one kernel: Inductor made three of that reduction at decode sizes). All of them
compute quant_layout's fp8_linear_reference step by step, so the rewrite changes no value (on the GPU,
Inductor's lowering of fp8_quantize may round the scale differently by one unit in the last place).
Runs after the fusions (fused QKV and gate/up are single linears by then).
"""

import operator

import torch
from torch import fx

import graphllm.ops.quantized_linear  # noqa: F401  (registers the ops)
import graphllm.ops.silu_and_mul  # noqa: F401  (graphllm.silu_and_mul, which _is_silu_mul_for_fp8 names)
from graphllm.ir.graph import StepGraph, new_node
from graphllm.passes.base import GraphPass

ops = torch.ops.graphllm


class QuantizeFP8Activations(GraphPass):
    """fp8_linear -> fp8_quantize + fp8_linear_quantized; counts {"linears": n, "quantizations": n}."""

    name = "quantize_fp8_activations"
    version = 1

    def apply(self, graph: StepGraph) -> dict[str, int]:
        g = graph.graph
        shared: dict[tuple, tuple[fx.Node, fx.Node]] = {}
        swiglu = 0
        linears = [n for n in g.nodes if n.op == "call_function" and n.target == ops.fp8_linear.default]
        for lin in linears:
            x, weight, weight_scale, input_scale, bias = _arguments(lin)
            key = (x, input_scale)
            if key not in shared:
                with g.inserting_before(lin):  # the first linear of the pair: before every other
                    if _is_silu_mul_for_fp8(x):
                        quant = new_node(g, ops.silu_and_mul_fp8.default, x.args, lin)
                        swiglu += 1
                    else:
                        quant = new_node(g, ops.fp8_quantize.default, (x, input_scale), lin)
                    xq = new_node(g, operator.getitem, (quant, 0), lin)
                    scale = new_node(g, operator.getitem, (quant, 1), lin)
                shared[key] = xq, scale
            xq, scale = shared[key]
            with g.inserting_before(lin):
                out = new_node(g, ops.fp8_linear_quantized.default,
                               (xq, scale, weight, weight_scale, bias, _dtype(lin, x)), lin)
            lin.replace_all_uses_with(out)
            g.erase_node(lin)
        return {"linears": len(linears), "quantizations": len(shared), "silu_and_mul_fp8": swiglu}


def _arguments(lin: fx.Node) -> tuple:
    """fp8_linear's (x, weight, weight_scale, input_scale, bias), defaults filled in."""
    args = list(lin.args) + [None] * (5 - len(lin.args))
    for i, name in enumerate(("x", "weight", "weight_scale", "input_scale", "bias")):
        if name in lin.kwargs:
            args[i] = lin.kwargs[name]
    return tuple(args)


def _is_silu_mul_for_fp8(x: fx.Node) -> bool:
    """x = silu_and_mul(...) read only by fp8 linears with dynamic scales: its quantization fuses into it."""
    return (x.op == "call_function" and x.target == ops.silu_and_mul.default and not x.kwargs
            and all(u.target == ops.fp8_linear.default and _arguments(u)[3] is None for u in x.users))


def _dtype(lin: fx.Node, x: fx.Node) -> torch.dtype:
    """The linear's output dtype: its input's (fp8_linear returns x's dtype)."""
    val = lin.meta.get("val", x.meta.get("val"))
    if val is None:
        raise ValueError(f"quantize_fp8_activations: {lin.name} has no fake value to read its dtype from")
    return val.dtype
