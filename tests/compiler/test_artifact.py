"""Artifacts: relocatable, loaded in a fresh process without code generation, and refused with
a clear message when damaged, incomplete or built for another environment."""

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap

import pytest

from graphllm import Engine, SamplingParams
from graphllm.compiler import artifact as A
from graphllm.compiler.artifact import ArtifactError
from tests.conftest import TEST_CACHE_DIR

PROMPTS = [[1, 5, 9, 17], [1, 42, 43, 44, 45, 46, 47]]
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)

# Runs in a fresh interpreter: every Inductor code-generation entry point raises, and the
# Inductor cache points at an empty directory that must stay empty.
FRESH_LOAD = textwrap.dedent("""
    import json, os, sys
    import torch._inductor.compile_fx as compile_fx, torch._inductor.cpp_builder as cpp_builder
    import torch._inductor.graph as graph
    def forbidden(*args, **kwargs):
        raise AssertionError("code generation during Engine.load")
    compile_fx.compile_fx = compile_fx.compile_fx_aot = forbidden
    cpp_builder.CppBuilder.build = forbidden
    graph.GraphLowering.codegen = forbidden
    from graphllm import Engine, SamplingParams
    engine = Engine.load(sys.argv[1])
    outs = engine.generate(json.loads(sys.argv[2]), SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    print(json.dumps([o.outputs[0].token_ids for o in outs]))
""")


@pytest.fixture
def artifact(compiled_dir, tmp_path):
    """A private copy of the tiny Llama artifact, safe to damage."""
    return shutil.copytree(compiled_dir("llama"), tmp_path / "art")


def test_moved_artifact_loads_in_fresh_process_without_codegen(compiled_dir, tiny_model_dir, tmp_path):
    moved = tmp_path / "elsewhere" / "art"
    shutil.copytree(compiled_dir("llama"), tmp_path / "original")
    shutil.move(tmp_path / "original", moved)
    empty_cache = tmp_path / "inductor-cache"
    env = {**__import__("os").environ, "TORCHINDUCTOR_CACHE_DIR": str(empty_cache)}
    result = subprocess.run([sys.executable, "-c", FRESH_LOAD, str(moved), json.dumps(PROMPTS)],
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    eager = Engine.from_pretrained(tiny_model_dir("llama")[0]).generate(PROMPTS, GREEDY)
    assert json.loads(result.stdout.splitlines()[-1]) == [o.outputs[0].token_ids for o in eager]
    assert not empty_cache.exists() or not any(empty_cache.rglob("*.so"))


def test_engine_load_records_its_start_up_phases(compiled_dir):
    engine = Engine.load(compiled_dir("llama"))
    phases = engine.state.startup_seconds
    assert list(phases) == ["verify", "weights", "step", "tokenizer", "kv_cache", "graphs"]
    assert all(seconds >= 0 for seconds in phases.values())


def test_damaged_manifest(artifact):
    (artifact / "manifest.json").write_text('{"schema_version": 1, "model": ')
    with pytest.raises(ArtifactError, match="manifest.json is damaged.*graphllm compile"):
        Engine.load(artifact)


def test_missing_weight_file(artifact):
    (artifact / "weights.safetensors").unlink()
    with pytest.raises(ArtifactError, match="missing weights.safetensors.*graphllm compile --model"):
        Engine.load(artifact)


def test_damaged_step_package(artifact):
    data = bytearray((artifact / "step.pt2").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (artifact / "step.pt2").write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="step.pt2 is damaged"):
        Engine.load(artifact)


def test_fingerprint_mismatch_names_the_difference(artifact):
    manifest = json.loads((artifact / "manifest.json").read_text())
    manifest["environment"]["torch"] = "1.13.0"
    (artifact / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match=r"torch: built for '1.13.0'.*Recompile it with: graphllm compile"):
        Engine.load(artifact)


def test_not_an_artifact(tmp_path):
    with pytest.raises(ArtifactError, match="no manifest.json"):
        Engine.load(tmp_path)


def test_limits_beyond_the_artifact_are_refused(artifact):
    with pytest.raises(ValueError, match="max_num_seqs=1000 does not fit the artifact"):
        Engine.load(artifact, max_num_seqs=1000)


def test_manifest_records_passes_and_environment(artifact):
    manifest = json.loads((artifact / "manifest.json").read_text())
    names = [p["name"] for p in manifest["passes"]]
    assert names[-2:] == ["eliminate_noops", "dce"] and "fuse_qkv" in names
    assert all(len(p["uuid"]) == 16 for p in manifest["passes"])
    assert manifest["environment"]["device_name"] == "cpu"
    assert {"step.pt2", "weights.safetensors", "graphs/before.txt", "graphs/after.txt"} <= set(manifest["files"])
    assert manifest["compile"]["buckets"] == [1, 2, 4, 8, 16, 32, 48, 64]


def flip_a_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("name", ["weights.safetensors", "step.pt2", "tokenizer.json", "graphs/after.py"])
def test_a_changed_byte_in_any_file_is_refused_naming_it(artifact, name):
    flip_a_byte(artifact / name)  # same size: only the sha256 can tell
    with pytest.raises(ArtifactError, match=f"{name} is damaged or was changed .its sha256.*Recompile it with"):
        Engine.load(artifact)


def test_manifest_lists_every_file_written_with_its_size_and_sha256(compiled_dir):
    art = compiled_dir("llama")
    files = json.loads((art / "manifest.json").read_text())["files"]
    on_disk = {p.relative_to(art).as_posix() for p in art.rglob("*") if p.is_file()} - {"manifest.json"}
    assert set(files) == on_disk and {"weights.safetensors", "step.pt2", "tokenizer.json"} <= on_disk
    for name, record in files.items():
        data = (art / name).read_bytes()
        assert record == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}, name


def test_a_truncated_file_gets_the_size_message_before_any_hashing(artifact, monkeypatch):
    with open(artifact / "weights.safetensors", "r+b") as f:
        f.truncate(100)
    monkeypatch.setattr(A, "sha256_file", lambda path: pytest.fail(f"hashed {path}"))
    with pytest.raises(ArtifactError, match="weights.safetensors is damaged or was changed .its size differs"):
        Engine.load(artifact)


@pytest.mark.parametrize("name", ["graphs/extra.py", "added_tokens.json"])
def test_an_unlisted_file_is_refused_naming_it(artifact, name):
    (artifact / name).write_text("{}")  # added_tokens.json: read by the tokenizer, though not code
    with pytest.raises(ArtifactError, match=f"holds {name}, which its manifest does not list.*Recompile it with"):
        Engine.load(artifact)


def test_an_old_manifest_without_hashes_is_refused_with_a_recompile_message(artifact):
    manifest = json.loads((artifact / "manifest.json").read_text())
    manifest["schema_version"] = 1
    del manifest["files"]["weights.safetensors"]["sha256"]  # schema 1 hashed files up to 256 MiB only
    (artifact / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="schema version 1, this graphllm reads 3.*Recompile it with: graphllm "
                                            "compile --model"):
        Engine.load(artifact)
    manifest["schema_version"] = 3  # the current schema, but a record without its hash
    (artifact / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="manifest.json is damaged .its file list lacks sizes or sha256s"):
        Engine.load(artifact)


def test_a_manifest_naming_a_file_outside_the_artifact_is_refused(artifact):
    manifest = json.loads((artifact / "manifest.json").read_text())
    manifest["files"]["../outside"] = manifest["files"]["config.json"]
    (artifact / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="names a file outside the artifact"):
        Engine.load(artifact)


def modes(art):
    return {p.relative_to(art).as_posix(): stat.S_IMODE(p.stat().st_mode) for p in [art, *art.rglob("*")]}


def test_compiled_files_are_0644_and_directories_0755(compiled_dir):
    """safetensors writes weights.safetensors 0600: unreadable to a server running as another user."""
    art = compiled_dir("llama")
    assert {name: mode for name, mode in modes(art).items()
            if mode != (0o755 if (art / name).is_dir() else 0o644)} == {}


def test_manifest_writing_sets_modes_whatever_the_umask(tmp_path):
    art = tmp_path / "art"
    (art / "graphs").mkdir(parents=True, mode=0o700)
    (art / "graphs" / "a.txt").write_text("a")
    (art / "weights.safetensors").write_bytes(b"w")
    (art / "weights.safetensors").chmod(0o600)
    (art / "step.pt2").write_bytes(b"s")
    (art / "step.pt2").chmod(0o777)
    old = os.umask(0o077)
    try:
        A.write_manifest(art, {})
    finally:
        os.umask(old)
    assert modes(art) == {".": 0o755, "graphs": 0o755, "graphs/a.txt": 0o644, "weights.safetensors": 0o644,
                          "step.pt2": 0o644, "manifest.json": 0o644}


def test_compile_cache_is_reused(compiled_dir, tiny_model_dir, monkeypatch):
    import graphllm.compiler.pipeline as pipeline
    compiled_dir("llama")
    monkeypatch.setattr(pipeline, "compile_model", lambda *a, **k: pytest.fail("recompiled a cached artifact"))
    engine = Engine.from_pretrained(tiny_model_dir("llama")[0], compile=True, dtype="float32", cache_dir=TEST_CACHE_DIR)
    assert engine.state.model_path == compiled_dir("llama")


def test_inductor_lowering_gives_eager_tokens(tiny_model_dir, tmp_path):
    """The CUDA lowering (standalone Inductor compile, weights lifted to inputs), run on CPU."""
    from graphllm.compiler.pipeline import compile_model
    from graphllm.config import CompileConfig
    path = tiny_model_dir("qwen3")[0]
    config = CompileConfig(dtype="float32", lowering="inductor", max_num_seqs=8, max_num_batched_tokens=256)
    manifest = compile_model(path, tmp_path / "art", config, "cpu", show_progress=False)
    assert manifest["lowering"]["kind"] == "inductor" and (tmp_path / "art" / "step.inductor").is_file()
    compiled = Engine.load(tmp_path / "art").generate(PROMPTS, GREEDY)
    eager = Engine.from_pretrained(path).generate(PROMPTS, GREEDY)
    assert [o.outputs[0].token_ids for o in compiled] == [o.outputs[0].token_ids for o in eager]
