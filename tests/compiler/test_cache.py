"""compiled_artifact: one directory per cache key under cache_dir, compiled the first time and
reused after, by the function itself and by EngineConfig(compile=True).

Compiles at most once (small_config, about 12 s on 2 cores), into the tests' shared cache: nothing
when an earlier run left the artifact there."""

from pathlib import Path

import pytest
import torch

from graphllm.compiler import cache
from graphllm.compiler.artifact import MANIFEST, read_manifest
from graphllm.compiler.cache import compiled_artifact
from graphllm.compiler.pipeline import cache_key
from graphllm.config import EngineConfig
from graphllm.runtime.setup import build_runtime
from tests.conftest import TEST_CACHE_DIR, compile_cached

CPU = torch.device("cpu")
ARTIFACTS = Path(TEST_CACHE_DIR) / "artifacts"


def default_config(path) -> EngineConfig:
    return EngineConfig(model=str(path), dtype="float32")  # what compiled_dir compiles


def small_config(path) -> EngineConfig:
    return EngineConfig(model=str(path), dtype="float32", max_num_seqs=4, max_num_batched_tokens=64)


@pytest.fixture
def no_compile(monkeypatch):
    """compile_model raises: what passes under it never compiled."""
    def compile_model(*args, **kwargs):
        raise AssertionError("compiled again")

    monkeypatch.setattr(cache, "compile_model", compile_model)


def test_the_artifact_is_named_by_its_cache_key_under_cache_dir(tiny_model_dir, compiled_dir):
    path, _ = tiny_model_dir("llama")
    art = compiled_dir("llama")
    key = cache_key(path, default_config(path).compile_config(), CPU)
    assert art == ARTIFACTS / key and read_manifest(art)["cache_key"] == key


def test_the_same_inputs_return_the_same_directory_without_compiling(tiny_model_dir, compiled_dir, no_compile,
                                                                      capsys):
    path, _ = tiny_model_dir("llama")
    art = compiled_dir("llama")
    mtime = (art / MANIFEST).stat().st_mtime_ns
    again = compiled_artifact(path, default_config(path).compile_config(), CPU, ARTIFACTS, show_progress=True)
    assert again == art and (art / MANIFEST).stat().st_mtime_ns == mtime
    assert capsys.readouterr().out == ""  # no phase timings: nothing ran


def test_a_different_compile_config_gets_its_own_directory(tiny_model_dir, compiled_dir, monkeypatch):
    path, _ = tiny_model_dir("llama")
    small = compile_cached(small_config(path), path)
    assert small.parent == ARTIFACTS and small != compiled_dir("llama")
    assert small.name == cache_key(path, small_config(path).compile_config(), CPU)
    manifest = read_manifest(small)
    assert (manifest["compile"]["max_num_seqs"], manifest["compile"]["max_num_batched_tokens"]) == (4, 64)
    assert read_manifest(compiled_dir("llama"))["compile"]["max_num_seqs"] == 64  # left as it was
    monkeypatch.setattr(cache, "compile_model", lambda *a, **k: pytest.fail("compiled again"))
    assert compile_cached(small_config(path), path) == small


def test_engine_config_compile_uses_the_cache_of_its_cache_dir(tiny_model_dir, compiled_dir, no_compile):
    path, _ = tiny_model_dir("llama")
    config = default_config(path)
    assert config.artifact_cache == Path.home() / ".cache" / "graphllm" / "artifacts"  # when none is given
    rt = build_runtime(EngineConfig(model=str(path), dtype="float32", compile=True, cache_dir=TEST_CACHE_DIR))
    assert rt.state.model_path == compiled_dir("llama") and rt.model is None
