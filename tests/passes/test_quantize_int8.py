"""QuantizeInt8: every linear but lm_head becomes graphllm.int8_linear (weight-only, per channel);
the graph computes what the model with the dequantized weights computes."""

import pytest
import torch

from graphllm.passes.quantization.quantize_int8 import QuantizeInt8
from tests.passes.harness import assert_same_function, dequantized_twin, logits_relative_error, run_pass


@pytest.fixture(scope="module", params=("llama", "qwen2"))
def quantized(request):
    return run_pass(QuantizeInt8(), request.param)


def test_computes_the_dequantized_model(quantized):
    before, after, _, _, _, config = quantized
    assert_same_function(dequantized_twin(before, after), after, config, seeds=(1, 2), atol=1e-4)


def test_close_to_the_float_model(quantized):
    before, after, _, _, _, config = quantized
    assert 1e-5 < logits_relative_error(before, after, config) < 0.03  # 127 levels per channel


def test_counts_ops_and_weights(quantized):
    _, after, counts, _, ops_after, config = quantized
    layers = config.num_hidden_layers
    assert counts == {"quantized": 7 * layers, "kept": 0}
    assert ops_after["int8_linear.default"] == 7 * layers and ops_after["linear.default"] == 1
    p = "model.model.layers.1.self_attn.o_proj"
    assert after.weights[f"{p}.qweight"].dtype == torch.int8
    assert after.weights[f"{p}.qweight"].shape == (config.hidden_size, config.num_attention_heads * config.head_dim)
    assert after.weights[f"{p}.weight_scale"].shape == (config.hidden_size,)
