"""QuantizeFP8: every linear but lm_head becomes graphllm.fp8_linear (W8A8: float8 weights with a
scale per channel, activations quantized per token); with the activation rounding simulated, the
graph computes what the model with the dequantized weights computes."""

import pytest
import torch

from graphllm.kernels import quant_layout as Q
from graphllm.passes.quantization.quantize_fp8 import QuantizeFP8
from tests.passes.harness import assert_same_function, dequantized_twin, logits_relative_error, run_pass


@pytest.fixture(scope="module", params=("llama", "qwen3"))
def quantized(request):
    return run_pass(QuantizeFP8(), request.param)


def fp8_rows(x: torch.Tensor) -> torch.Tensor:
    """x rounded to float8 per row (max|row| -> 448), back in x's dtype: the activation W8A8 reads."""
    rows = x.reshape(-1, x.shape[-1])
    xq, scale = Q.quantize_fp8_rows(rows, None)
    return (xq.float() * scale).to(x.dtype).view(x.shape)


def test_computes_the_dequantized_model_on_rounded_activations(quantized):
    before, after, _, _, _, config = quantized
    twin = dequantized_twin(before, after)
    for node in twin.graph.nodes:  # every linear but lm_head reads float8-rounded activations
        if node.target is torch.ops.aten.linear.default and not node.args[1].target.startswith("model.lm_head"):
            with twin.graph.inserting_before(node):
                node.args = (twin.graph.call_function(fp8_rows, (node.args[0],)), *node.args[1:])
    twin.recompile()
    assert_same_function(twin, after, config, seeds=(1, 2), atol=1e-4)


def test_close_to_the_float_model(quantized):
    before, after, _, _, _, config = quantized
    assert 1e-4 < logits_relative_error(before, after, config) < 0.15  # 3 mantissa bits, both operands


def test_counts_ops_and_weights(quantized):
    before, after, counts, _, ops_after, config = quantized
    layers = config.num_hidden_layers
    assert counts == {"quantized": 7 * layers, "kept": 0}
    assert ops_after["fp8_linear.default"] == 7 * layers and ops_after["linear.default"] == 1
    p = "model.model.layers.0.mlp.gate_proj"
    qweight, scale = after.weights[f"{p}.qweight"], after.weights[f"{p}.weight_scale"]
    assert qweight.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32
    assert torch.equal(qweight.float().abs().amax(dim=1), torch.full_like(scale, 448.0))  # each row's max maps to 448
    torch.testing.assert_close(Q.dequantize_per_channel(qweight, scale), before.weights[f"{p}.weight"],
                               atol=0.02, rtol=0.07)
