"""Artifacts: relocatable, loaded in a fresh process without code generation, and refused with
a clear message when damaged, incomplete or built for another environment."""

import json
import shutil
import subprocess
import sys
import textwrap

import pytest

from graphllm import Engine, SamplingParams
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
