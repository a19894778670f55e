"""fp8 KV-cache scales, per layer as vLLM keeps them: a checkpoint's k_scale / v_scale reach the
attention backend bound to each layer's cache, the compiled step hands the backend exactly those cache
tensors (so every write and read finds its layer's scales), and --calculate-kv-scales computes them
from a calibration prefill as vLLM does (amax / 200 for K, amax / 100 for V), checked against
transformers' own keys and values of the same text."""

import pytest
import torch

from graphllm import Engine, EngineConfig, SamplingParams
from graphllm.kernels.kv_quant import KVScales
from graphllm.runtime.kv_calibration import calibration_ids
from tests.conftest import compile_cached
from tests.quantized_checkpoints import write_ct_fp8_folder

CHECKPOINT_SCALES = [KVScales(0.5, 0.25), KVScales(0.75, 0.375)]  # what write_ct_fp8_folder stores per layer


def layer_scales(engine: Engine) -> list[KVScales]:
    return [engine.runner.backend.scales_for(cache) for cache in engine.runner.kv_caches]


def test_checkpoint_kv_scales_are_bound_per_layer_and_found_by_the_compiled_step(tmp_path):
    folder = write_ct_fp8_folder(tmp_path / "fp8-kv", "llama", kv_scales=True)
    art = compile_cached(EngineConfig(model=str(folder)), folder)
    engine = Engine.load(art, kv_cache_dtype="fp8")
    assert layer_scales(engine) == CHECKPOINT_SCALES
    backend, seen = engine.runner.backend, []
    lookup = backend.scales_for
    backend.scales_for = lambda cache: seen.append(lookup(cache)) or seen[-1]
    engine.generate([[1, 2, 3, 4]], SamplingParams(max_tokens=3, ignore_eos=True))
    # every KV write and read of the compiled step found its layer's scales, none fell back to the default
    assert seen and set(seen) == set(CHECKPOINT_SCALES)


def test_calculated_kv_scales_match_transformers_kv_amax_per_layer(tiny_model_dir):
    path, hf = tiny_model_dir("llama")
    engine = Engine.from_pretrained(path, kv_cache_dtype="fp8", calculate_kv_scales=True)
    ids = calibration_ids(engine.tokenizer, hf.config.vocab_size)
    with torch.no_grad():
        cache = hf(torch.tensor([ids]), use_cache=True).past_key_values
    got = layer_scales(engine)
    assert len(got) == len(cache.layers) == 2
    for scales, layer in zip(got, cache.layers):  # rotated keys, as the cache stores them
        assert scales.k == pytest.approx(layer.keys.abs().max().item() / 200, rel=1e-4)
        assert scales.v == pytest.approx(layer.values.abs().max().item() / 100, rel=1e-4)
    assert got[0] != got[1]


def test_calculate_kv_scales_leaves_a_model_dtype_cache_alone(tiny_model_dir):
    path, _ = tiny_model_dir("llama")
    assert layer_scales(Engine.from_pretrained(path, calculate_kv_scales=True)) == [KVScales()] * 2
