"""QuantizeInt4: every linear but lm_head becomes graphllm.int4_linear; the graph computes what the
model with the dequantized weights computes, and stays close to the float model."""

import pytest
import torch

from graphllm.kernels import quant_layout as Q
from graphllm.passes.quantization.quantize_int4 import QuantizeInt4
from tests.passes.harness import assert_same_function, dequantized_twin, logits_relative_error, run_pass

ARCHS = ("llama", "qwen2", "qwen3")


@pytest.fixture(scope="module", params=ARCHS)
def quantized(request):
    return (request.param, *run_pass(QuantizeInt4(group_size=32), request.param))


def test_computes_the_dequantized_model(quantized):
    _, before, after, _, _, _, config = quantized
    assert_same_function(dequantized_twin(before, after), after, config, seeds=(1, 2), atol=1e-4)


def test_close_to_the_float_model(quantized):
    _, before, after, _, _, _, config = quantized
    error = logits_relative_error(before, after, config)
    # it did change the function, by int4 rounding only: min-max 4-bit codes of Gaussian weights
    # err by ~11% each (range 6 sigma / 15 steps / sqrt(12)), compounding over 14 random linears
    assert 1e-3 < error < 0.4


def test_counts_and_ops(quantized):
    _, _, after, counts, ops_before, ops_after, config = quantized
    layers = config.num_hidden_layers
    assert counts == {"quantized": 7 * layers, "kept": 0}
    assert ops_after["int4_linear.default"] == 7 * layers
    assert ops_after["linear.default"] == 1  # lm_head
    assert ops_before["linear.default"] == 7 * layers + 1


def test_weights_are_packed_int4(quantized):
    arch, before, after, _, _, _, config = quantized
    p = "model.model.layers.0.mlp.down_proj"
    w = after.weights
    assert f"{p}.weight" not in w
    k, n = config.intermediate_size, config.hidden_size
    assert w[f"{p}.qweight"].dtype == torch.int32 and w[f"{p}.qweight"].shape == (k // 8, n)
    assert w[f"{p}.scales"].shape == w[f"{p}.zeros"].shape == (k // 32, n)
    dense = Q.dequantize_int4(w[f"{p}.qweight"], w[f"{p}.scales"], w[f"{p}.zeros"])
    torch.testing.assert_close(dense, before.weights[f"{p}.weight"], atol=0.05, rtol=0)
    if arch == "qwen2":  # biases pass through untouched
        assert torch.equal(w["model.model.layers.0.self_attn.q_proj.bias"],
                           before.weights["model.model.layers.0.self_attn.q_proj.bias"])


def test_lm_head_on_request():
    _, after, counts, _, ops_after, config = run_pass(QuantizeInt4(group_size=32, include_lm_head=True), "qwen3")
    assert counts["quantized"] == 7 * config.num_hidden_layers + 1
    assert "linear.default" not in ops_after


def test_a_width_that_does_not_divide_stays_unquantized(caplog):
    # hidden 64 and intermediate 128: group 128 holds only down_proj (K = 128)
    with caplog.at_level("INFO"):
        _, after, counts, _, ops_after, config = run_pass(QuantizeInt4(group_size=128), "llama")
    layers = config.num_hidden_layers
    assert counts == {"quantized": layers, "kept": 6 * layers}
    assert ops_after["int4_linear.default"] == layers
    assert "q_proj stays float32: its input width 64 is not a multiple of the group size 128" in caplog.text


def test_a_group_size_the_layout_cannot_pack_is_refused():
    with pytest.raises(ValueError, match="multiple of 8"):
        QuantizeInt4(group_size=12)
