"""PassManager: the ordered list of passes a CompileConfig asks for, with a fixed clean-up tail.

Order matters: quantization comes first (the fusions concatenate quantized weights as they do
float ones; with fp8, --quantization or a pre-quantized checkpoint, quantize_fp8_experts follows
quantize_fp8 for the MoE experts, and a rank's shard_tp runs before both, so each rank quantizes its
own slices), gate/up must be fused before silu·mul can match its split, and skinny_linear
comes after every pass that matches aten.linear, linear_prologue after it (it folds norms
into graphllm.linear), linear_epilogue after that (it takes SwiGLU out of down's prologue into gate_up), row_sumsq
after those (it pairs a product with the add_rms_norm_linear after it), and for fp8 quantize_fp8_activations after all of them (one activation
quantization per fused linear); clean-up (no-op elimination, then dead code) always runs last. A pass
meant for some devices only (`GraphPass.devices`) is skipped on other graphs, and its report
says why. `uuid()` hashes the list and every pass's uuid,
so an artifact's cache key changes whenever any pass changes.
"""

import hashlib
import time
from dataclasses import dataclass, field
from typing import Callable

from graphllm.config import CompileConfig
from graphllm.ir.graph import StepGraph, format_graph
from graphllm.passes.base import GraphPass


@dataclass
class PassReport:
    name: str
    uuid: str
    nodes_before: int
    nodes_after: int
    counts: dict[str, int]
    seconds: float
    skipped: str | None = None  # why the pass did not run on this graph (its devices)


@dataclass(frozen=True)
class Prequantized:
    """A pre-quantized checkpoint's linears, unpacked by the loader into graphllm's layout
    (graphllm/kernels/quant_layout.py): the scheme ("fp8" or "int4") and, by module path
    ("model.layers.0.self_attn.q_proj"), the tensors of each quantized linear; for fp8, by stack path
    ("model.layers.0.mlp.experts.gate_up_proj"), the float8 MoE experts and their scales."""
    scheme: str
    linears: dict
    experts: dict = field(default_factory=dict)


def quantization_pass(config: CompileConfig, prequantized: Prequantized | None) -> GraphPass | None:
    """The quantize_<scheme> pass: over the checkpoint's own tensors, or quantizing float weights."""
    from graphllm.passes.quantization.quantize_fp8 import QuantizeFP8
    from graphllm.passes.quantization.quantize_int4 import QuantizeInt4
    from graphllm.passes.quantization.quantize_int8 import QuantizeInt8
    if prequantized is not None:
        make = {"fp8": QuantizeFP8, "int4": QuantizeInt4}[prequantized.scheme]
        return make(checkpoint=prequantized.linears)
    lm_head = config.quantize_lm_head
    return {"fp8": lambda: QuantizeFP8(include_lm_head=lm_head), "int8": lambda: QuantizeInt8(include_lm_head=lm_head),
            "int4": lambda: QuantizeInt4(config.quantization_group_size, include_lm_head=lm_head),
            None: lambda: None}[config.quantization]()


def build_pass_list(config: CompileConfig, prequantized: Prequantized | None = None) -> list[GraphPass]:
    from graphllm.passes.fusion.fuse_add_rmsnorm import FuseAddRMSNorm
    from graphllm.passes.fusion.fuse_gate_up import FuseGateUp
    from graphllm.passes.fusion.fuse_qkv import FuseQKV
    from graphllm.passes.fusion.fuse_rope_attention import FuseRopeAttention
    from graphllm.passes.fusion.fuse_silu_mul import FuseSiluMul
    from graphllm.passes.lowering.fuse_moe_router import FuseMoeRouter
    from graphllm.passes.lowering.int4_mma_layout import Int4MMALayout
    from graphllm.passes.lowering.linear_epilogue import LinearEpilogue
    from graphllm.passes.lowering.linear_prologue import LinearPrologue
    from graphllm.passes.lowering.row_sumsq import RowSumsq
    from graphllm.passes.lowering.shared_norm_prologue import SharedNormPrologue
    from graphllm.passes.lowering.skinny_linear import SkinnyLinear
    from graphllm.passes.quantization.quantize_fp8_activations import QuantizeFP8Activations
    from graphllm.passes.quantization.quantize_fp8_experts import QuantizeFP8Experts
    from graphllm.passes.utility.dce import DeadCodeElimination
    from graphllm.passes.utility.eliminate_noops import EliminateNoops

    cleanup = [EliminateNoops(), DeadCodeElimination()]
    scheme = prequantized.scheme if prequantized is not None else config.quantization
    # None (the default): the int4 folds only, measured faster at batch 1 (benchmarks/RESULTS.md, s44); off
    # elsewhere, where bf16's A/Bs measured them neutral or slower
    int4_folds = scheme == "int4" and not config.int4_mma  # the MMA layout takes plain int4_linear nodes only
    epilogue = int4_folds if config.linear_epilogue is None else config.linear_epilogue
    sumsq = int4_folds if config.row_sumsq is None else config.row_sumsq
    chosen = [(config.fuse_qkv, FuseQKV), (config.fuse_gate_up, FuseGateUp),
              (config.fuse_silu_mul and config.fuse_gate_up, FuseSiluMul),
              (config.fuse_add_rmsnorm, FuseAddRMSNorm), (config.fuse_rope_attention, FuseRopeAttention),
              (config.skinny_linear, SkinnyLinear),
              (config.skinny_linear and config.linear_prologue,
               lambda: LinearPrologue(fp8=config.fp8_linear_prologue)),
              (config.skinny_linear and config.linear_prologue and config.shared_norm_prologue, SharedNormPrologue),
              (config.skinny_linear and config.fuse_moe_router, FuseMoeRouter),
              (config.skinny_linear and epilogue, lambda: LinearEpilogue(int4_only=config.linear_epilogue is None)),
              (config.skinny_linear and config.linear_prologue and sumsq,
               lambda: RowSumsq(int4_only=config.row_sumsq is None)),
              (config.int4_mma, Int4MMALayout)]
    linears = quantization_pass(config, prequantized)
    quantize = [linears] if linears else []
    if scheme == "fp8":  # the experts: quantized here, or the checkpoint's (a dense graph has none: a no-op)
        quantize.append(QuantizeFP8Experts(None if prequantized is None else prequantized.experts))
    late = [QuantizeFP8Activations()] if scheme == "fp8" else []  # after the fusions: one per fused linear
    return [EliminateNoops()] + quantize + [cls() for wanted, cls in chosen if wanted] + late + cleanup


class PassManager:
    def __init__(self, config: CompileConfig, prequantized: Prequantized | None = None,
                 shard: GraphPass | None = None):
        """shard: a rank's shard_tp pass, run first (before quantization and the fusions)."""
        self.passes = ([shard] if shard is not None else []) + build_pass_list(config, prequantized)

    def uuid(self) -> str:
        joined = ",".join(f"{p.name}:{p.uuid()}" for p in self.passes)
        return hashlib.sha256(joined.encode()).hexdigest()[:16]

    def run(self, graph: StepGraph, on_pass: Callable[[PassReport, str, str], None] | None = None
            ) -> list[PassReport]:
        """Run every pass; on_pass(report, graph text before, after) lets callers dump diffs."""
        reports = []
        for p in self.passes:
            text = format_graph(graph.gm) if on_pass else ""
            report = self.run_one(p, graph)
            reports.append(report)
            if on_pass:
                on_pass(report, text, format_graph(graph.gm) if report.skipped is None else text)
        return reports

    @staticmethod
    def run_one(p: GraphPass, graph: StepGraph) -> PassReport:
        """Apply p unless the graph's device is not one of its devices (then say why in the report)."""
        before = len(graph.graph.nodes)
        if not p.runs_on(graph.device):
            why = f"for {'/'.join(p.devices)} graphs, this one is {graph.device.type}"
            return PassReport(p.name, p.uuid(), before, before, {}, 0.0, why)
        start = time.perf_counter()
        counts = p(graph)
        return PassReport(p.name, p.uuid(), before, len(graph.graph.nodes), counts, time.perf_counter() - start)
