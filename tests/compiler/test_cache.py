"""compiled_artifact: one directory per cache key under cache_dir, compiled the first time and
reused after, by the function itself and by EngineConfig(compile=True).

Compiles at most once (small_config, about 12 s on 2 cores), into the tests' shared cache: nothing
when an earlier run left the artifact there."""

import subprocess
import sys
import threading
import time
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


def test_a_second_process_waits_for_the_compile_in_progress_and_reuses_it(tiny_model_dir, tmp_path, monkeypatch,
                                                                         capsys):
    """Two callers at once (threads here: flock's locks belong to open files, so they exclude each other as two
    processes would): the first compiles, the second says it waits, then returns the same artifact."""
    path, _ = tiny_model_dir("llama")
    config = small_config(path).compile_config()
    compiling, release, calls = threading.Event(), threading.Event(), []

    def slow_compile(model_dir, art, *args, **kwargs):
        calls.append(art)
        compiling.set()
        assert release.wait(30)
        art.mkdir(parents=True)
        (art / MANIFEST).write_text("{}")

    monkeypatch.setattr(cache, "compile_model", slow_compile)
    results = {}
    first = threading.Thread(target=lambda: results.setdefault(1, compiled_artifact(path, config, CPU, tmp_path)))
    first.start()
    assert compiling.wait(30)
    second = threading.Thread(target=lambda: results.setdefault(2, compiled_artifact(path, config, CPU, tmp_path)))
    second.start()
    deadline = time.monotonic() + 30
    while "waiting for it" not in capsys.readouterr().err:
        assert time.monotonic() < deadline, "the second caller never said it waits"
        time.sleep(0.05)
    assert second.is_alive() and 2 not in results  # it waits on the lock
    release.set()
    first.join(30), second.join(30)
    assert results[1] == results[2] == tmp_path / cache_key(path, config, CPU) and len(calls) == 1


COMPILE_ONE = """
import sys
from pathlib import Path
from graphllm.compiler.artifact import verify_artifact
from graphllm.compiler.cache import compiled_artifact
from graphllm.config import EngineConfig
import torch
config = EngineConfig(model=sys.argv[1], dtype="float32", max_num_seqs=4, max_num_batched_tokens=64)
art = compiled_artifact(Path(sys.argv[1]), config.compile_config(), torch.device("cpu"), Path(sys.argv[2]))
verify_artifact(art, torch.device("cpu"))
print(art)
"""


@pytest.mark.slow
def test_two_processes_asking_for_one_artifact_at_once_compile_it_once(tiny_model_dir, tmp_path):
    """Real processes, a real compile: before KEY.lock and per-compile staging, the second deleted the first's
    half-written directory or replaced the artifact the first was reading (seen on the GPU with two pytest-xdist
    workers, 2026-12-06)."""
    path, _ = tiny_model_dir("llama")
    procs = [subprocess.Popen([sys.executable, "-c", COMPILE_ONE, str(path), str(tmp_path / "cache")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    arts = {out.strip().splitlines()[-1] for out, _ in outs}
    assert len(arts) == 1
    assert sum("phase timings:" in err for _, err in outs) == 1  # one compile; the other waited or came after it
    key = Path(arts.pop()).name
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [key, key + ".lock"]
