"""--quantization from the command line and the Python API: what it builds, and the bad inputs it refuses."""

import json

import pytest

from graphllm import Engine, EngineConfig
from tests.cli.test_compile_inspect import run_cli
from tests.conftest import compile_cached
from tests.quantized_checkpoints import write_gptq_folder


@pytest.fixture(scope="module")
def int4_artifact(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("cli-q") / "art"
    result = run_cli("compile", "--model", str(tiny_model_dir("llama")[0]), "--out", str(out), "--max-num-seqs", "4",
                     "--quantization", "int4", "--quantization-group-size", "32")
    assert result.returncode == 0, result.stderr
    return out


def test_compile_int4_records_the_scheme_and_inspect_shows_the_pass(int4_artifact):
    manifest = json.loads((int4_artifact / "manifest.json").read_text())
    record = manifest["quantization"]
    kernels = record.pop("kernels")
    assert record == {"scheme": "int4", "source": "graphllm compile", "group_size": 32, "lm_head": False,
                      "quantized": 14, "kept": 0}
    # fused qkv [128, 64] and gate_up [256, 64], o [64, 64], down [64, 128]; on CPU every bucket dequantizes
    assert sorted(kernels) == ["int4 128x64", "int4 256x64", "int4 64x128", "int4 64x64"]
    assert kernels["int4 64x64"] == {str(b): "reference (dequantize, float32 matmul)" for b in (1, 2, 4)}
    assert "int4_linear" in (int4_artifact / "graphs" / "02_quantize_int4.diff").read_text()
    shown = run_cli("inspect", str(int4_artifact)).stdout
    assert "quantize_int4" in shown and "quantized=14" in shown
    assert "quantization: int4 (graphllm compile, group 32), 14 linears" in shown
    line = next(line for line in shown.splitlines() if line.strip().startswith("int4 64x64"))
    assert line.split(maxsplit=2)[2].startswith("1: reference (dequantize, float32 matmul); 2: ")


def test_an_unknown_scheme_lists_the_choices():
    result = run_cli("compile", "--out", "/nonexistent", "--quantization", "nf4")
    assert result.returncode == 2
    assert "invalid choice: 'nf4'" in result.stderr and "fp8" in result.stderr and "int4" in result.stderr
    with pytest.raises(ValueError, match="quantization must be one of fp8, int8, int4"):
        EngineConfig(quantization="nf4")


def test_a_checkpoint_format_on_a_float_model_is_refused(tiny_model_dir, tmp_path):
    result = run_cli("compile", "--model", str(tiny_model_dir("llama")[0]), "--out", str(tmp_path / "a"),
                     "--quantization", "gptq")
    assert result.returncode != 0
    assert "--quantization gptq names a pre-quantized checkpoint format" in result.stderr
    assert "has no quantization_config" in result.stderr


def test_a_prequantized_checkpoint_is_not_quantized_again(tmp_path):
    folder = write_gptq_folder(tmp_path / "gptq", "llama")
    result = run_cli("compile", "--model", str(folder), "--out", str(tmp_path / "a"), "--quantization", "fp8")
    assert result.returncode != 0
    assert "is a gptq checkpoint (int4); it cannot be quantized again with --quantization fp8" in result.stderr


def test_an_artifact_runs_as_compiled(int4_artifact):
    with pytest.raises(ValueError, match="compiled with quantization int4; it cannot run as fp8"):
        Engine.load(int4_artifact, quantization="fp8")
    assert Engine.load(int4_artifact, quantization="int4").generate([[1, 2, 3]])[0].outputs[0].token_ids


def test_from_pretrained_with_quantization_compiles(tiny_model_dir):
    path, _ = tiny_model_dir("llama")
    art = compile_cached(EngineConfig(model=str(path), quantization="int8"), path)
    engine = Engine.from_pretrained(path, quantization="int8", cache_dir=str(art.parent.parent))  # no compile=True
    assert engine.state.model_path == art  # the cached int8 artifact, not the eager model
