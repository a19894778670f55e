"""Fusions compose with quantization: fuse_qkv, fuse_gate_up and fuse_silu_mul over quantized
linears concatenate the packed weights and scales, and compute what the quantized graph computed."""

import pytest
import torch

from graphllm.ir import op_counts
from graphllm.passes.fusion.fuse_gate_up import FuseGateUp
from graphllm.passes.fusion.fuse_qkv import FuseQKV
from graphllm.passes.fusion.fuse_silu_mul import FuseSiluMul
from graphllm.passes.quantization.quantize_fp8 import QuantizeFP8
from graphllm.passes.quantization.quantize_int4 import QuantizeInt4
from graphllm.passes.quantization.quantize_int8 import QuantizeInt8
from tests.passes.harness import assert_same_function, copy_graph, static_fp8_checkpoint, tiny_step_graph

SCHEMES = {"fp8": (QuantizeFP8, "fp8_linear.default"), "int8": (QuantizeInt8, "int8_linear.default"),
           "int4": (lambda: QuantizeInt4(group_size=32), "int4_linear.default")}


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_fused_quantized_graph_computes_the_same(scheme, arch):
    make, op = SCHEMES[scheme]
    quantized, config = tiny_step_graph(arch)
    make()(quantized)
    fused = copy_graph(quantized)
    counts = [FuseQKV()(fused), FuseGateUp()(fused), FuseSiluMul()(fused)]
    layers = config.num_hidden_layers
    assert counts == [{"fused": layers}, {"fused": layers}, {"fused": layers}]
    assert op_counts(fused.gm)[op] == 4 * layers  # qkv, o, gate_up, down
    assert_same_function(quantized, fused, config, seeds=(1, 2), atol=1e-4)


def test_fused_int4_weights_concatenate_along_n():
    graph, config = tiny_step_graph("llama")
    QuantizeInt4(group_size=32)(graph)
    parts = {m: {t: graph.weights[f"model.model.layers.0.self_attn.{m}.{t}"] for t in ("qweight", "scales", "zeros")}
             for m in ("q_proj", "k_proj", "v_proj")}
    FuseQKV()(graph)
    for t in ("qweight", "scales", "zeros"):
        fused = graph.weights[f"model.model.layers.0.self_attn.qkv_proj.{t}"]
        assert torch.equal(fused, torch.cat([parts[m][t] for m in parts], dim=1))


def test_static_fp8_input_scales_are_shared():
    """A checkpoint's static activation scales: q/k/v observe one input, so their scales agree and the
    fused linear keeps that one (the largest, were they to differ)."""
    graph, config = tiny_step_graph("llama")
    counts = QuantizeFP8(checkpoint=static_fp8_checkpoint(graph))(graph)
    assert counts == {"quantized": 7 * config.num_hidden_layers, "kept": 0}
    fused = copy_graph(graph)
    FuseQKV()(fused)
    FuseGateUp()(fused)
    assert torch.equal(fused.weights["model.model.layers.0.self_attn.qkv_proj.input_scale"], torch.tensor([0.05]))
    assert_same_function(graph, fused, config, seeds=(1,), atol=1e-4)
