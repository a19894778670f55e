"""--quantization from the command line and the Python API: what it builds, and the bad inputs it refuses."""

import json

import pytest

from graphllm import Engine, EngineConfig
from graphllm.compiler.pipeline import compile_model
from graphllm.config import CompileConfig
from graphllm.models.errors import ModelLoadError
from tests.cli.test_compile_inspect import run_cli
from tests.conftest import compile_cached
from tests.quantized_checkpoints import edit_config, write_ct_fp8_folder, write_gptq_folder


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


@pytest.mark.parametrize("options, message", [
    (dict(quantize_lm_head=True), "quantize_lm_head applies to quantization fp8, int8, int4 only, got .* None"),
    (dict(quantization="gptq", quantize_lm_head=True), "quantize_lm_head applies to .* got quantization 'gptq'"),
    (dict(quantization_group_size=64), r"quantization_group_size \(64\) applies to quantization int4 only"),
    (dict(quantization="fp8", quantization_group_size=64), "applies to quantization int4 only, got quantization 'fp8'"),
])
def test_a_switch_that_would_be_ignored_is_refused(options, message):
    """Before, --quantize-lm-head without --quantization (or on a pre-quantized checkpoint) and a group size
    without int4 ran, lm_head float and the group size unused, without a word."""
    for config in (EngineConfig, CompileConfig):
        with pytest.raises(ValueError, match=message):
            config(**options)


def test_quantize_lm_head_on_a_float_model_run_eager_is_refused(tiny_model_dir):
    result = run_cli("generate", "--model", str(tiny_model_dir("llama")[0]), "--eager", "--quantize-lm-head",
                     "--prompt", "w1", "--max-tokens", "1")
    assert result.returncode == 2 and "quantize_lm_head applies to quantization" in result.stderr


def test_quantize_lm_head_on_an_fp8_checkpoint_is_refused(tmp_path):
    """--quantization fp8 names the fp8 checkpoint method too, so the flags pass EngineConfig; the checkpoint's
    lm_head is float, and stays so."""
    folder = write_ct_fp8_folder(tmp_path / "fp8", weight_strategy="tensor", dynamic=False)
    edit_config(folder, lambda c: c.update(quantization_config={
        "quant_method": "fp8", "activation_scheme": "static", "ignored_layers": ["lm_head"]}))
    config = CompileConfig(quantization="fp8", quantize_lm_head=True)
    with pytest.raises(ModelLoadError, match="pre-quantized fp8 checkpoint; its lm_head stays as stored"):
        compile_model(folder, tmp_path / "art", config, device="cpu", show_progress=False)
    assert not (tmp_path / "art").exists()
