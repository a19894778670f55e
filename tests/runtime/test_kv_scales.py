"""fp8 KV-cache scales: a checkpoint's k_scale / v_scale reach the attention backend, and
--calculate-kv-scales computes them from a calibration prefill as vLLM does (amax / 200 for K,
amax / 100 for V), checked against transformers' own keys and values of the same text."""

import pytest
import torch

from graphllm import Engine, EngineConfig
from graphllm.kernels.kv_quant import KVScales
from graphllm.runtime.kv_calibration import calibration_ids
from tests.conftest import compile_cached
from tests.quantized_checkpoints import write_ct_fp8_folder


def test_checkpoint_kv_scales_reach_the_backend(tmp_path):
    folder = write_ct_fp8_folder(tmp_path / "fp8-kv", "llama", kv_scales=True)  # k 0.5, v 0.25 in every layer
    art = compile_cached(EngineConfig(model=str(folder)), folder)
    engine = Engine.load(art, kv_cache_dtype="fp8")
    assert engine.runner.backend.kv_scales == KVScales(0.5, 0.25)
    assert Engine.load(art).runner.backend.kv_scales == KVScales(0.5, 0.25)  # kept; unused by a bf16/f32 cache


def test_calculated_kv_scales_match_transformers_kv_amax(tiny_model_dir):
    path, hf = tiny_model_dir("llama")
    engine = Engine.from_pretrained(path, kv_cache_dtype="fp8", calculate_kv_scales=True)
    ids = calibration_ids(engine.tokenizer, hf.config.vocab_size)
    with torch.no_grad():
        cache = hf(torch.tensor([ids]), use_cache=True).past_key_values
    keys = max(layer.keys.abs().max().item() for layer in cache.layers)  # rotated keys, as the cache stores them
    values = max(layer.values.abs().max().item() for layer in cache.layers)
    got = engine.runner.backend.kv_scales
    assert got.k == pytest.approx(keys / 200, rel=1e-4) and got.v == pytest.approx(values / 100, rel=1e-4)


def test_calculate_kv_scales_leaves_a_model_dtype_cache_alone(tiny_model_dir):
    path, _ = tiny_model_dir("llama")
    assert Engine.from_pretrained(path, calculate_kv_scales=True).runner.backend.kv_scales == KVScales()
