"""Hostile pre-quantized checkpoints: a config.json option of the wrong JSON type, a layout option that
changes the unpacking, a damaged scale or a partial set of KV-cache scales is refused with a ModelLoadError
that names it, instead of a traceback from deep inside, a silently wrong ignore list, NaN logits, or an
AssertionError at engine start (the fuzzing pass of 2026-12; see also test_quantized_checkpoint.py).
"""

import re
import shutil

import pytest
from safetensors.torch import load_file, save_file

from graphllm.models.loader import ModelLoadError, load_checkpoint
from graphllm.models.quantization import read_checkpoint_quantization
from tests import quantized_checkpoints as qc

Q_PROJ = "model.layers.0.self_attn.q_proj"
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 32}
AWQ = {"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": True}


def ct_fp8(**edits) -> dict:
    config = qc.ct_config(dict(strategy="channel"), dict(strategy="token", dynamic=True), "float-quantized",
                          ["lm_head"], None)
    config.update(edits)
    return config


def ct_fp8_group(**edits) -> dict:
    config = ct_fp8()
    config["config_groups"]["group_0"].update(edits)
    return config


@pytest.mark.parametrize("config, message", [
    ("gptq", "quantization_config must be a JSON object, got str 'gptq'"),
    ({"quant_method": ["gptq"]}, "quant_method ['gptq'] is not supported"),
    (ct_fp8(config_groups=[{"targets": ["Linear"]}]), "quantization_config.config_groups must be a JSON object"),
    (ct_fp8_group(weights=[8]), "config_groups.group_0.weights must be a JSON object"),
    (ct_fp8_group(input_activations="dynamic"), "config_groups.group_0.input_activations must be a JSON object"),
    (ct_fp8(kv_cache_scheme="fp8"), "quantization_config.kv_cache_scheme must be a JSON object"),
    # a string where a list of names belongs was read as the list of its characters
    (ct_fp8(ignore="lm_head"), "quantization_config.ignore must be a list of module names, got 'lm_head'"),
    ({"quant_method": "fp8", "activation_scheme": "dynamic", "ignored_layers": "lm_head"},
     "quantization_config.ignored_layers must be a list of module names"),
    ({**AWQ, "modules_to_not_convert": "down_proj"}, "quantization_config.modules_to_not_convert must be a list"),
    ({**GPTQ, "modules_in_block_to_quantize": "self_attn.q_proj"}, "modules_in_block_to_quantize must be a list"),
    ({**GPTQ, "group_size": True}, "group_size=True is not supported"),
    # AWQ layouts other than AutoAWQ's gemm: transformers 5 writes `format` (`version` is its legacy name)
    ({**AWQ, "format": "gemv"}, "format='gemv' is not supported"),
    ({**AWQ, "backend": "llm-awq"}, "backend='llm-awq' is not supported"),
])
def test_malformed_quantization_config_is_named(config, message):
    with pytest.raises(ModelLoadError, match=re.escape(message)):
        read_checkpoint_quantization({"quantization_config": config})


def test_modules_in_block_to_quantize_as_one_flat_list():
    nested = read_checkpoint_quantization({"quantization_config": {
        **GPTQ, "modules_in_block_to_quantize": [["self_attn.q_proj"], ["mlp.up_proj"]]}})
    flat = read_checkpoint_quantization({"quantization_config": {
        **GPTQ, "modules_in_block_to_quantize": ["self_attn.q_proj", "mlp.up_proj"]}})
    assert flat == nested and not flat.ignored(Q_PROJ) and flat.ignored("model.layers.0.mlp.down_proj")


def test_awq_format_gemm_as_transformers_5_writes_it():
    quant = read_checkpoint_quantization({"quantization_config": {**AWQ, "format": "gemm", "version": "gemm"}})
    assert quant.method == "awq" and quant.format == "gemm"


# --- damaged tensors of real folders -------------------------------------------------------------

WRITERS = {
    "gptq": lambda p: qc.write_gptq_folder(p),
    "ct-w4a16": lambda p: qc.write_ct_w4a16_folder(p),
    "ct-fp8-static": lambda p: qc.write_ct_fp8_folder(p, weight_strategy="tensor", dynamic=False, kv_scales=True),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    written = {}

    def copy(name: str, tmp_path):
        if name not in written:
            written[name] = WRITERS[name](tmp_path_factory.mktemp(name))
        return shutil.copytree(written[name], tmp_path / name)
    return copy


def set_values(folder, values: dict[tuple[str, int], float]) -> None:
    """(tensor name, flat index) -> value, written back into the folder's model.safetensors."""
    tensors = load_file(folder / "model.safetensors")
    for (name, index), value in values.items():
        tensors[name].view(-1)[index] = value
    save_file(tensors, folder / "model.safetensors")


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("name, tensor, value, rule", [
    ("ct-fp8-static", f"{Q_PROJ}.weight_scale", NAN, "finite and positive"),
    ("ct-fp8-static", f"{Q_PROJ}.weight_scale", 0.0, "finite and positive"),
    ("ct-fp8-static", f"{Q_PROJ}.weight_scale", -0.01, "finite and positive"),
    ("ct-fp8-static", f"{Q_PROJ}.input_scale", 0.0, "finite and positive"),  # activations are divided by it
    ("ct-fp8-static", f"{Q_PROJ}.input_scale", INF, "finite and positive"),
    ("ct-fp8-static", "model.layers.1.self_attn.v_scale", 0.0, "finite and positive"),  # so is the KV cache
    ("ct-fp8-static", "model.layers.1.self_attn.k_scale", NAN, "finite and positive"),
    ("gptq", f"{Q_PROJ}.scales", NAN, "finite"),
    ("ct-w4a16", f"{Q_PROJ}.weight_scale", INF, "finite"),
])
def test_a_bad_scale_value_is_named(folders, tmp_path, name, tensor, value, rule):
    """Loaded before, the bad scale gave NaN (or all-zero) rows and logits without a word."""
    folder = folders(name, tmp_path)
    set_values(folder, {(tensor, -1): value})
    with pytest.raises(ModelLoadError, match=re.escape(f"tensor {tensor!r} holds ") + f".*every scale must be {rule}"):
        load_checkpoint(folder)


def test_a_zero_int4_scale_loads(folders, tmp_path):
    """float16 int4 scales of near-zero groups may underflow to 0: such a group is all zeros, as its weights were."""
    folder = folders("gptq", tmp_path)
    set_values(folder, {(f"{Q_PROJ}.scales", 0): 0.0})
    assert load_checkpoint(folder).quantized[Q_PROJ]["scales"].view(-1)[0] == 0


def test_kv_scales_of_some_layers_only_are_named(folders, tmp_path):
    """Without kv_cache_scheme, layer 0's scales alone used to compile, then stop the engine at start with
    `AssertionError: one KVScales per layer` (backends/base.py bind_layer_scales)."""
    folder = folders("ct-fp8-static", tmp_path)
    qc.edit_config(folder, lambda c: c["quantization_config"].update(kv_cache_scheme=None))
    tensors = load_file(folder / "model.safetensors")
    save_file({n: t for n, t in tensors.items() if not n.startswith("model.layers.1.self_attn.")
               or not n.endswith(("k_scale", "v_scale"))}, folder / "model.safetensors")
    with pytest.raises(ModelLoadError, match=r"missing tensor 'model.layers.1.self_attn.k_scale' .*layer 0 has"):
        load_checkpoint(folder)


def test_a_linear_stored_quantized_against_modules_in_block_to_quantize_is_named(folders, tmp_path):
    """The config keeps mlp float but the weights are int4: named as that disagreement, not as a tensor
    'the model has no such parameter'."""
    folder = folders("gptq", tmp_path)
    attention = [["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"], ["self_attn.o_proj"]]
    qc.edit_config(folder, lambda c: c["quantization_config"].update(modules_in_block_to_quantize=attention))
    with pytest.raises(ModelLoadError, match=r"tensor 'model.layers.0.mlp.down_proj.g_idx' is stored quantized, but "
                                             r"config.json's quantization_config keeps 'model.layers.0.mlp.down_proj' "
                                             "unquantized"):
        load_checkpoint(folder)
