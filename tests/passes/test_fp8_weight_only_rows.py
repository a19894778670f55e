"""fp8_weight_only_rows: at up to `rows` rows the fp8 linears compute the dequantized model's product (x not
quantized), beyond them W8A8 as before; quantize_fp8_activations leaves them whole and linear_prologue carries
`rows` into the fused fp8 ops."""

import pytest
import torch

from graphllm.config import CompileConfig
from graphllm.passes.fusion.fuse_add_rmsnorm import FuseAddRMSNorm
from graphllm.passes.fusion.fuse_gate_up import FuseGateUp
from graphllm.passes.fusion.fuse_qkv import FuseQKV
from graphllm.passes.fusion.fuse_silu_mul import FuseSiluMul
from graphllm.passes.lowering.linear_prologue import LinearPrologue
from graphllm.passes.lowering.skinny_linear import SkinnyLinear
from graphllm.passes.manager import PassManager
from graphllm.passes.quantization.fp8_weight_only_rows import FP8WeightOnlyRows
from graphllm.passes.quantization.quantize_fp8 import QuantizeFP8
from graphllm.passes.quantization.quantize_fp8_activations import QuantizeFP8Activations
from graphllm.passes.utility.dce import DeadCodeElimination
from tests.passes.harness import assert_same_function, copy_graph, dequantized_twin, tiny_step_graph

ops = torch.ops.graphllm
FP8_OPS = (ops.fp8_linear.default, ops.fp8_rms_norm_linear.default, ops.fp8_add_rms_norm_linear.default,
           ops.fp8_silu_and_mul_linear.default, ops.fp8_gelu_tanh_and_mul_linear.default)
SPLIT_OPS = (ops.fp8_quantize.default, ops.fp8_linear_quantized.default, ops.silu_and_mul_fp8.default)
STEP_ROWS = 16  # harness.random_step_inputs: 3 sequences of at most 6 new tokens, at most 16 rows a step


def quantized(arch: str):
    """(the float graph's dequantized twin, the fp8 graph after the fusions, config)."""
    graph, config = tiny_step_graph(arch)
    float_graph = copy_graph(graph)
    QuantizeFP8()(graph)
    twin = dequantized_twin(float_graph, graph)
    for p in (FuseQKV(), FuseGateUp(), FuseSiluMul(), FuseAddRMSNorm(), SkinnyLinear()):
        p(graph)
    return twin, graph, config


def finish(graph, *passes):
    for p in (*passes, QuantizeFP8Activations(), DeadCodeElimination()):
        p(graph)
    return graph


def fp8_nodes(graph) -> list:
    return [n for n in graph.graph.nodes if n.op == "call_function" and n.target in FP8_OPS]


def targets(graph) -> list:
    return [n.target for n in graph.graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize("arch", ("llama", "gemma2"))
@pytest.mark.parametrize("prologue", (False, True))
def test_weight_only_rows_compute_the_dequantized_model(arch, prologue):
    """rows = 16 covers every step here: the graph then computes what the float model with the dequantized
    weights computes (x never quantized), with or without the norms folded into the fp8 linears (CPU: the fused
    ops run their parts); nothing is left for quantize_fp8_activations. The W8A8 graph does differ from it."""
    twin, graph, config = quantized(arch)
    w8a8 = finish(copy_graph(graph))
    counts = FP8WeightOnlyRows(STEP_ROWS)(graph)
    finish(graph, *([LinearPrologue(fp8=True)] if prologue else []))
    nodes = fp8_nodes(graph)
    assert counts["linears"] == 4 * config.num_hidden_layers  # fused qkv, o_proj, fused gate_up, down
    assert nodes and all(n.args[-1] == STEP_ROWS for n in nodes)
    assert not set(SPLIT_OPS) & set(targets(graph))
    assert (ops.fp8_linear.default in targets(graph)) and (
        (ops.fp8_add_rms_norm_linear.default in targets(graph)) == prologue)
    assert_same_function(twin, graph, config, seeds=(1, 2), atol=1e-5)
    with pytest.raises(AssertionError):
        assert_same_function(twin, w8a8, config, seeds=(1,), atol=1e-5)


def test_more_rows_than_weight_only_ones_stay_w8a8():
    """rows = 1 at steps of 3..16 rows: the W8A8 function exactly, though no linear is split."""
    _, graph, config = quantized("llama")
    w8a8 = finish(copy_graph(graph))
    finish(graph, FP8WeightOnlyRows(1), LinearPrologue(fp8=True))
    assert not set(SPLIT_OPS) & set(targets(graph))
    assert_same_function(w8a8, graph, config, seeds=(1, 2), atol=0.0)


def test_the_pass_list_and_its_bounds():
    """CompileConfig.fp8_weight_only_rows puts the pass before linear_prologue (then folding into fp8 linears) for
    fp8 only, changes the pass list's uuid, and is refused outside 0..16."""
    names = lambda pm: [p.name for p in pm.passes]  # noqa: E731
    on = PassManager(CompileConfig(quantization="fp8", fp8_weight_only_rows=1))
    off = PassManager(CompileConfig(quantization="fp8"))
    assert names(on).index("fp8_weight_only_rows") < names(on).index("linear_prologue")
    assert next(p for p in on.passes if p.name == "linear_prologue").fp8
    assert "fp8_weight_only_rows" not in names(off) and on.uuid() != off.uuid()
    assert on.uuid() != PassManager(CompileConfig(quantization="fp8", fp8_weight_only_rows=2)).uuid()
    assert "fp8_weight_only_rows" not in names(PassManager(CompileConfig(quantization="int8",
                                                                         fp8_weight_only_rows=1)))
    for bad in (-1, 17):
        with pytest.raises(ValueError, match="fp8_weight_only_rows"):
            CompileConfig(quantization="fp8", fp8_weight_only_rows=bad)
