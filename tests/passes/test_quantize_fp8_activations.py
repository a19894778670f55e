"""quantize_fp8_activations: each fp8 linear's activation quantization becomes an fp8_quantize node (for
Inductor to fuse into its producer), shared by the linears that read one input, and the graph computes
exactly what it computed before, eager and compiled."""

import pytest
import torch

from graphllm.ir import op_counts
from graphllm.kernels import quant_layout as Q
from graphllm.passes.fusion.fuse_add_rmsnorm import FuseAddRMSNorm
from graphllm.passes.fusion.fuse_gate_up import FuseGateUp
from graphllm.passes.fusion.fuse_qkv import FuseQKV
from graphllm.passes.fusion.fuse_silu_mul import FuseSiluMul
from graphllm.passes.quantization.quantize_fp8 import QuantizeFP8
from graphllm.passes.quantization.quantize_fp8_activations import QuantizeFP8Activations
from graphllm.passes.utility.dce import DeadCodeElimination
from tests.passes.harness import assert_same_function, copy_graph, static_fp8_checkpoint, tiny_step_graph


@pytest.mark.parametrize("fuse", [False, True], ids=["separate", "fused"])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_splits_quantization_out_and_computes_the_same(arch, fuse):
    before, config = tiny_step_graph(arch)
    QuantizeFP8()(before)
    if fuse:
        for p in (FuseQKV(), FuseGateUp(), FuseSiluMul(), FuseAddRMSNorm()):
            p(before)
    after = copy_graph(before)
    counts = QuantizeFP8Activations()(after)
    layers = config.num_hidden_layers
    linears = (4 if fuse else 7) * layers
    # per layer: the attention input (q, k, v share it), o_proj's, the MLP input (gate, up share it), down's
    assert counts == {"linears": linears, "quantizations": 4 * layers, "silu_and_mul_fp8": layers if fuse else 0}
    DeadCodeElimination()(after)
    ops = op_counts(after.gm)
    assert ops["fp8_linear_quantized.default"] == linears and "fp8_linear.default" not in ops
    assert ops["fp8_quantize.default"] == (3 if fuse else 4) * layers
    assert ops.get("silu_and_mul_fp8.default", 0) == (layers if fuse else 0) and "silu_and_mul.default" not in ops
    assert_same_function(before, after, config, seeds=(1, 2), atol=0.0)


def test_static_input_scales_stay_static():
    graph, config = tiny_step_graph("llama")
    QuantizeFP8(checkpoint=static_fp8_checkpoint(graph))(graph)
    after = copy_graph(graph)
    counts = QuantizeFP8Activations()(after)
    # each linear has a scale of its own (get_attr nodes differ): one quantization per linear
    assert counts == {"linears": 7 * config.num_hidden_layers, "quantizations": 7 * config.num_hidden_layers,
                      "silu_and_mul_fp8": 0}
    quantize = next(n for n in after.gm.graph.nodes if n.target == torch.ops.graphllm.fp8_quantize.default)
    assert quantize.args[1] is not None and quantize.args[1].op == "get_attr"
    assert_same_function(graph, after, config, seeds=(1,), atol=0.0)


def test_quantize_matches_the_reference_rows():
    """fp8_quantize is quantize_fp8_rows over the last dim, any leading shape, both scale kinds."""
    x = torch.randn(2, 3, 64) * 5
    xq, scale = torch.ops.graphllm.fp8_quantize(x)
    want_q, want_scale = Q.quantize_fp8_rows(x.reshape(6, 64))
    assert torch.equal(xq.reshape(6, 64).view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(scale.reshape(6, 1), want_scale) and scale.shape == (2, 3, 1)
    xq, scale = torch.ops.graphllm.fp8_quantize(x, torch.tensor([0.25]))
    assert torch.equal(scale, torch.full((2, 3, 1), 0.25))
    assert torch.equal(xq.float(), (x / 0.25).clamp(-448, 448).to(Q.FP8_DTYPE).float())


@pytest.mark.parametrize("shape", [(1, 64), (3, 2, 96)])
def test_silu_and_mul_fp8_is_the_two_ops(shape):
    x = torch.randn(*shape) * 4
    xq, scale = torch.ops.graphllm.silu_and_mul_fp8(x)
    want_q, want_scale = torch.ops.graphllm.fp8_quantize(torch.ops.graphllm.silu_and_mul(x))
    assert xq.shape == want_q.shape and scale.shape == want_scale.shape
    assert torch.equal(xq.view(torch.uint8), want_q.view(torch.uint8)) and torch.equal(scale, want_scale)
