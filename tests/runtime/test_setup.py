"""build_runtime and the facts it resolves (limits, max_model_len, KV blocks, EOS ids, KV dtype),
eager and from an artifact; and graphllm/device.py's meaning of "auto"."""

import json
from dataclasses import replace

import pytest
import torch

from graphllm.config import DEFAULT_LIMITS, EngineConfig
from graphllm.device import resolve_device, resolve_dtype
from graphllm.ir.capture import StepModule
from graphllm.models.loader import read_hf_config
from graphllm.models.registry import resolve_architecture
from graphllm.runtime.kv_cache import kv_bytes_per_block
from graphllm.backends.triton_backend import XQA_SCRATCH_BYTES
from graphllm.runtime.setup import (Limits, build_runtime, eos_token_ids, gpu_kv_budget, reserved_after_kv_cache,
                                    resolve_kv_cache_dtype, resolve_limits, resolve_max_model_len, resolve_num_blocks)
from graphllm.runtime.sampling_params import SamplingParams
from graphllm.runtime.sequence import Sequence
from tests.tiny_models import make_tokenizer

CPU = torch.device("cpu")
BUILT = {"max_num_seqs": 16, "max_num_batched_tokens": 512, "block_size": 32}  # an artifact's compile section


@pytest.fixture
def llama(tiny_model_dir):
    """(model folder, its ModelConfig): max_position_embeddings 256, EOS 2."""
    path, _ = tiny_model_dir("llama")
    return path, resolve_architecture(read_hf_config(path))[1]


# -- limits ---------------------------------------------------------------------------------


def test_limits_config_beats_artifact_beats_defaults():
    assert resolve_limits(EngineConfig()) == Limits(**DEFAULT_LIMITS)
    assert resolve_limits(EngineConfig(max_num_batched_tokens=100)) == Limits(64, 100, 16)
    assert resolve_limits(EngineConfig(), BUILT) == Limits(16, 512, 32)
    assert resolve_limits(EngineConfig(max_num_seqs=4, max_num_batched_tokens=256), BUILT) == Limits(4, 256, 32)


@pytest.mark.parametrize("name", ["max_num_seqs", "max_num_batched_tokens"])
def test_asking_more_than_the_artifact_was_compiled_for_names_the_flag(name):
    asked = BUILT[name] + 1
    flag = "--" + name.replace("_", "-")
    with pytest.raises(ValueError, match=f"{name}={asked} does not fit .* {name}={BUILT[name]}.*{flag} {asked}"):
        resolve_limits(EngineConfig(**{name: asked}), BUILT)


@pytest.mark.parametrize("block_size", [16, 64])
def test_block_size_must_equal_the_artifacts(block_size):
    assert resolve_limits(EngineConfig(block_size=32), BUILT).block_size == 32
    with pytest.raises(ValueError, match=f"block_size={block_size} does not fit .*--block-size"):
        resolve_limits(EngineConfig(block_size=block_size), BUILT)


# -- max_model_len, KV blocks ---------------------------------------------------------------


def test_max_model_len_defaults_to_the_models_positions_and_may_not_exceed_them(llama):
    _, model_config = llama
    assert resolve_max_model_len(EngineConfig(), model_config) == 256
    assert resolve_max_model_len(EngineConfig(max_model_len=100), model_config) == 100
    assert resolve_max_model_len(EngineConfig(max_model_len=256), model_config) == 256
    with pytest.raises(ValueError, match="max_model_len=257 exceeds .*max_position_embeddings=256"):
        resolve_max_model_len(EngineConfig(max_model_len=257), model_config)


def test_explicit_num_kv_blocks_wins_over_the_budget(llama):
    _, model_config = llama
    config = EngineConfig(num_kv_blocks=20, kv_cache_memory_gib=1e-9)
    assert resolve_num_blocks(config, Limits(64, 2048, 16), model_config, torch.float32, CPU, 256) == 20


def test_budget_blocks_are_what_the_memory_holds_capped_at_every_sequence_at_full_length(llama):
    _, model_config = llama
    limits = Limits(64, 2048, 16)
    per_block = kv_bytes_per_block(model_config, 16, torch.float32)  # 8 KiB: 2 layers, K and V, 2 heads of 16
    budget = EngineConfig(kv_cache_memory_gib=100 * per_block / 2**30)
    assert resolve_num_blocks(budget, limits, model_config, torch.float32, CPU, 256) == 100
    assert resolve_num_blocks(budget, limits, model_config, torch.float8_e4m3fn, CPU, 256) == 400  # 1/4 the bytes
    assert resolve_num_blocks(budget, Limits(2, 2048, 16), model_config, torch.float32, CPU, 64) == 2 * 64 // 16
    assert resolve_num_blocks(EngineConfig(), limits, model_config, torch.float32, CPU, 256) == 64 * 256 // 16


@pytest.mark.parametrize("option", [dict(num_kv_blocks=7), dict(kv_cache_memory_gib=7.5 * 8192 / 2**30)])
def test_a_cache_shorter_than_max_model_len_is_refused(llama, option):
    _, model_config = llama
    with pytest.raises(ValueError, match="holds 112 tokens, fewer than max_model_len=128"):
        resolve_num_blocks(EngineConfig(**option), Limits(64, 2048, 16), model_config, torch.float32, CPU, 128)


def test_the_gpu_budget_is_what_the_utilization_leaves_less_what_is_reserved():
    gib = 2**30
    assert gpu_kv_budget(70 * gib, 80 * gib, 0.9) == 62 * gib  # 80 GiB card, 10 GiB of weights: 8 GiB kept back
    assert gpu_kv_budget(70 * gib, 80 * gib, 0.95) == 66 * gib
    assert gpu_kv_budget(70 * gib, 80 * gib, 0.9, XQA_SCRATCH_BYTES) == 62 * gib - 256 * 2**20
    with pytest.raises(ValueError, match=r"no GPU memory left for the KV cache: 7.00 GiB of 80.00 GiB are free .*"
                                         r"--gpu-memory-utilization 0.9 leaves 8.00 GiB .*--kv-cache-memory-gib"):
        gpu_kv_budget(7 * gib, 80 * gib, 0.9)
    with pytest.raises(ValueError, match="0.25 GiB to attention scratch"):
        gpu_kv_budget(8 * gib + 2**20, 80 * gib, 0.9, XQA_SCRATCH_BYTES)


def test_xqas_scratch_is_kept_out_of_the_cache_only_where_xqa_may_run():
    """Regression: XQA's 256 MiB workspace was allocated after the cache had taken its share (s37 left alone)."""
    cuda = torch.device("cuda")  # a device name: no GPU is touched
    assert reserved_after_kv_cache(EngineConfig(), torch.float8_e4m3fn, cuda) == XQA_SCRATCH_BYTES
    assert reserved_after_kv_cache(EngineConfig(xqa_decode=True), torch.float8_e4m3fn, cuda) == XQA_SCRATCH_BYTES
    assert reserved_after_kv_cache(EngineConfig(xqa_decode=False), torch.float8_e4m3fn, cuda) == 0
    assert reserved_after_kv_cache(EngineConfig(), torch.bfloat16, cuda) == 0
    assert reserved_after_kv_cache(EngineConfig(), torch.float8_e4m3fn, CPU) == 0


@pytest.mark.parametrize("option", [dict(gpu_memory_utilization=0.0), dict(gpu_memory_utilization=1.5),
                                    dict(gpu_memory_utilization=float("nan")), dict(kv_cache_memory_gib=0.0),
                                    dict(kv_cache_memory_gib=-1.0)])
def test_memory_options_out_of_range_are_refused(option):
    with pytest.raises(ValueError, match=next(iter(option))):
        EngineConfig(**option)


# -- EOS ids, KV dtype ----------------------------------------------------------------------


def test_eos_ids_gather_the_config_generation_config_and_tokenizer(llama, tmp_path):
    _, model_config = llama
    assert eos_token_ids(tmp_path, model_config, None) == {2}
    tokenizer = make_tokenizer()
    tokenizer.eos_token = "w0"  # id 3
    assert eos_token_ids(tmp_path, model_config, tokenizer) == {2, 3}
    for saved, expected in (([2, 7, 9], {2, 3, 7, 9}), (11, {2, 3, 11}), (None, {2, 3})):
        (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": saved}))
        assert eos_token_ids(tmp_path, model_config, tokenizer) == expected
    assert eos_token_ids(tmp_path, replace(model_config, eos_token_ids=()), None) == set()


def test_kv_cache_dtype_is_the_models_unless_fp8():
    for dtype in (torch.float32, torch.bfloat16):
        assert resolve_kv_cache_dtype(EngineConfig(), dtype) == dtype
        assert resolve_kv_cache_dtype(EngineConfig(kv_cache_dtype="fp8"), dtype) == torch.float8_e4m3fn


# -- build_runtime --------------------------------------------------------------------------


def test_eager_runtime_fills_every_state_field(llama):
    path, model_config = llama
    rt = build_runtime(EngineConfig(model=str(path), max_model_len=128, num_kv_blocks=40, max_num_seqs=8))
    s = rt.state
    assert rt.model is not None and rt.tokenizer is not None
    assert (s.model_path, s.device, s.dtype, s.kv_cache_dtype) == (path, CPU, torch.float32, torch.float32)
    assert (s.max_model_len, s.num_kv_blocks, s.eos_token_ids) == (128, 40, {2})
    assert s.model_config == model_config and s.limits == Limits(8, 2048, 16)
    shape = (2, 41, 16, 2, 16)  # one block more than the pool: the padding rows' block
    assert [tuple(c.shape) for c in rt.runner.kv_caches] == [shape, shape]
    assert s.kv_cache_bytes == 41 * kv_bytes_per_block(model_config, 16, torch.float32)
    assert (rt.pool.num_blocks, rt.pool.block_size) == (40, 16)
    assert (rt.scheduler.max_num_seqs, rt.scheduler.max_num_batched_tokens) == (8, 2048)
    assert rt.runner.backend.name == "torch" and rt.runner.graphs is None  # CPU: the reference, no CUDA graphs


def test_fp8_kv_cache_is_allocated_in_float8(llama):
    path, model_config = llama
    rt = build_runtime(EngineConfig(model=str(path), kv_cache_dtype="fp8", num_kv_blocks=40))
    assert rt.state.dtype == torch.float32 and rt.state.kv_cache_dtype == torch.float8_e4m3fn
    assert {c.dtype for c in rt.runner.kv_caches} == {torch.float8_e4m3fn}
    assert rt.state.kv_cache_bytes == 41 * kv_bytes_per_block(model_config, 16, torch.float8_e4m3fn)


def test_artifact_runtime_takes_the_artifacts_limits_and_runs_its_compiled_step(llama, compiled_dir):
    path, model_config = llama
    art = compiled_dir("llama")
    rt = build_runtime(EngineConfig(artifact=str(art), max_num_seqs=8, num_kv_blocks=40))
    assert rt.model is None and rt.tokenizer is not None
    assert rt.state.model_path == art and rt.state.dtype == torch.float32
    assert rt.state.model_config == model_config and rt.state.eos_token_ids == {2}
    assert rt.state.limits == Limits(8, 2048, 16)  # the artifact's, but for the one asked
    eager = build_runtime(EngineConfig(model=str(path), num_kv_blocks=40))
    logits = []
    for r in (rt, eager):
        seq = Sequence(0, "r", 0, [1, 5, 9, 17], 4, SamplingParams())
        r.scheduler.add(seq)
        logits.append(r.runner.execute(r.scheduler.schedule()))
    assert isinstance(eager.runner.step, StepModule) and not isinstance(rt.runner.step, StepModule)
    torch.testing.assert_close(logits[0], logits[1], atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="max_num_seqs=65 does not fit the artifact"):
        build_runtime(EngineConfig(artifact=str(art), max_num_seqs=65))
    with pytest.raises(ValueError, match="compiled for dtype float32; it cannot run as bfloat16"):  # s35's fuzzing
        build_runtime(EngineConfig(artifact=str(art), dtype="bfloat16"))
    assert build_runtime(EngineConfig(artifact=str(art), dtype="float32", num_kv_blocks=40)).state.dtype == torch.float32


# -- graphllm/device.py ---------------------------------------------------------------------


def test_auto_device_is_cuda_only_when_available(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == CPU
    assert resolve_device("cuda:1") == torch.device("cuda", 1) and resolve_device(CPU) == CPU
    with pytest.raises(ValueError, match="device must be"):  # not torch's RuntimeError (s35's fuzzing)
        resolve_device("bogus")


def test_auto_dtype_is_float32_on_cpu_and_the_checkpoints_half_dtype_on_a_gpu():
    cuda = torch.device("cuda")
    half = {"dtype": "float16"}
    assert resolve_dtype("auto", half, CPU) == torch.float32
    assert resolve_dtype("auto", half, cuda) == torch.float16
    assert resolve_dtype("auto", {"torch_dtype": "float16"}, cuda) == torch.float16  # transformers 4's key
    assert resolve_dtype("auto", {"dtype": "float32"}, cuda) == torch.bfloat16
    assert resolve_dtype("auto", {}, cuda) == torch.bfloat16
    assert resolve_dtype("bfloat16", half, CPU) == torch.bfloat16
    assert resolve_dtype("float32", half, cuda) == torch.float32
    with pytest.raises(ValueError, match="dtype must be one of .* got 'fp16'"):
        resolve_dtype("fp16", half, CPU)


def test_damaged_tokenizer_and_generation_config_files_are_named(tiny_model_dir, tmp_path):
    """Regression (s35's fuzzing): a tokenizer.json that is not JSON printed transformers' bare parse error, and a
    generation_config.json holding a list an AttributeError; each now names its file."""
    import shutil

    from graphllm.runtime.setup import load_tokenizer
    folder = tmp_path / "m"
    shutil.copytree(tiny_model_dir("llama")[0], folder)
    (folder / "generation_config.json").write_text("[1]")
    _, model_config = resolve_architecture(read_hf_config(folder))
    with pytest.raises(ValueError, match="generation_config.json must hold a JSON object"):
        eos_token_ids(folder, model_config, None)
    (folder / "tokenizer.json").write_text("{")
    with pytest.raises(ValueError, match=f"tokenizer files of {folder} do not load"):
        load_tokenizer(folder)
