"""Pre-quantized checkpoints (compressed-tensors, GPTQ, AWQ, fp8) -> graphllm's internal layouts.

The oracle is each library's own dequantization of the folder written in its own layout
(tests/quantized_checkpoints.py): the internal layout must dequantize to exactly the same float32
weights. Refused options, damaged tensors and ignore lists each give an error that names them.
"""

import itertools
import json
import re
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from graphllm.kernels.quant_layout import FP8_DTYPE, dequantize_int4, dequantize_per_channel
from graphllm.models.loader import ModelLoadError, load_checkpoint, load_model
from graphllm.models.quantization import CheckpointQuantization, convert_linear, read_checkpoint_quantization
from tests import quantized_checkpoints as qc
from tests.tiny_models import make_hf_model

Q_PROJ = "model.layers.0.self_attn.q_proj"
WRITERS = {
    "gptq": lambda p: qc.write_gptq_folder(p),
    "gptq-asym": lambda p: qc.write_gptq_folder(p, sym=False),
    "gptq_v2": lambda p: qc.write_gptq_folder(p, sym=False, checkpoint_format="gptq_v2"),
    "gptq-per-channel": lambda p: qc.write_gptq_folder(p, group_size=-1),
    "gptq-desc_act-static-groups": lambda p: qc.write_gptq_folder(p, desc_act=True, static_groups=True),
    "gptq-qwen2-bias": lambda p: qc.write_gptq_folder(p, arch="qwen2"),
    "awq": lambda p: qc.write_awq_folder(p),
    "ct-fp8-channel-dynamic": lambda p: qc.write_ct_fp8_folder(p),
    "ct-fp8-tensor-static": lambda p: qc.write_ct_fp8_folder(p, weight_strategy="tensor", dynamic=False),
    "ct-fp8-qwen2-bias": lambda p: qc.write_ct_fp8_folder(p, arch="qwen2"),
    "ct-w4a16": lambda p: qc.write_ct_w4a16_folder(p),
    "ct-w4a16-asym": lambda p: qc.write_ct_w4a16_folder(p, sym=False),
    "ct-w4a16-channel": lambda p: qc.write_ct_w4a16_folder(p, group_size=None),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """name -> its folder, written once for the module."""
    written = {}

    def get(name: str):
        if name not in written:
            written[name] = WRITERS[name](tmp_path_factory.mktemp(name))
        return written[name]
    return get


def dequantized(tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    if "zeros" in tensors:
        return dequantize_int4(tensors["qweight"], tensors["scales"], tensors["zeros"])
    return dequantize_per_channel(tensors["qweight"], tensors["weight_scale"])


def library_weights(folder) -> dict[str, torch.Tensor]:
    """Module path -> float32 W [N, K] as the checkpoint's library dequantizes it."""
    config = json.loads((folder / "config.json").read_text())["quantization_config"]
    by_linear: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in load_file(folder / "model.safetensors").items():
        prefix, _, suffix = name.rpartition(".")
        if prefix.endswith(qc.LINEARS) and suffix != "bias":
            by_linear.setdefault(prefix, {})[suffix] = tensor
    return {p: qc.dequantize_linear(config["quant_method"], config, s) for p, s in by_linear.items()}


def rewrite(folder, edit) -> None:
    tensors = load_file(folder / "model.safetensors")
    edit(tensors)
    save_file(tensors, folder / "model.safetensors")


# --- every format: exact conversion ----------------------------------------------------------------

@pytest.mark.parametrize("name", WRITERS)
def test_internal_layout_dequantizes_to_the_library_weights(folders, name):
    loaded = load_checkpoint(folders(name))
    library = library_weights(folders(name))
    assert sorted(loaded.quantized) == sorted(library) and len(library) == 14  # 7 linears x 2 layers
    for prefix, tensors in loaded.quantized.items():
        assert torch.equal(dequantized(tensors), library[prefix]), prefix


@pytest.mark.parametrize("name", ["gptq", "awq", "ct-w4a16-asym"])
def test_int4_layout_shapes_and_dtypes(folders, name):
    loaded = load_checkpoint(folders(name), dtype=torch.bfloat16)
    t = loaded.quantized["model.layers.1.mlp.down_proj"]  # [N, K] = [64, 128], G = 32
    assert (t["qweight"].dtype, t["qweight"].shape) == (torch.int32, (16, 64))
    assert t["scales"].shape == t["zeros"].shape == (4, 64)
    assert t["scales"].dtype == t["zeros"].dtype == torch.bfloat16
    assert torch.equal(t["zeros"], t["zeros"].round()) and 0 <= t["zeros"].min() and t["zeros"].max() <= 15
    assert loaded.quantization.scheme == "int4" and loaded.quantization.group_size == 32


@pytest.mark.parametrize("name", ["ct-fp8-channel-dynamic", "ct-fp8-tensor-static"])
def test_fp8_layout_shapes_and_dtypes(folders, name):
    loaded = load_checkpoint(folders(name), dtype=torch.bfloat16)
    t = loaded.quantized[Q_PROJ]
    assert (t["qweight"].dtype, t["qweight"].shape) == (FP8_DTYPE, (64, 64))
    assert (t["weight_scale"].dtype, t["weight_scale"].shape) == (torch.float32, (64,))
    static = name.endswith("static")
    assert loaded.quantization.input_dynamic is not static
    assert ("input_scale" in t) is static and (not static or t["input_scale"].shape == (1,))


def test_quantized_weight_is_a_placeholder_and_the_bias_a_parameter(folders):
    loaded = load_checkpoint(folders("gptq-qwen2-bias"), dtype=torch.float16)
    q_proj = loaded.model.model.layers[0].self_attn.q_proj
    assert q_proj.weight.shape == (64, 64) and q_proj.weight.stride() == (0, 0)
    assert q_proj.weight.dtype == torch.float16 and not q_proj.weight.any()
    assert loaded.quantized[Q_PROJ]["bias"].data_ptr() == q_proj.bias.data_ptr()  # one tensor, not a copy
    assert torch.equal(q_proj.bias, load_file(folders("gptq-qwen2-bias") / "model.safetensors")[f"{Q_PROJ}.bias"])


def test_lm_head_and_norms_stay_float(folders):
    loaded = load_checkpoint(folders("ct-fp8-channel-dynamic"))
    stored = load_file(folders("ct-fp8-channel-dynamic") / "model.safetensors")
    assert "lm_head" not in loaded.quantized
    assert torch.equal(loaded.model.lm_head.weight, stored["lm_head.weight"])
    assert torch.equal(loaded.model.model.norm.weight, stored["model.norm.weight"])


def test_dequantized_folder_loads_in_transformers(folders, tmp_path):
    import transformers
    out = qc.write_dequantized_folder(folders("awq"), tmp_path / "awq-float")
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).state_dict()
    library = library_weights(folders("awq"))
    assert all(torch.equal(hf[f"{p}.weight"], w) for p, w in library.items())
    original = make_hf_model("llama").state_dict()[f"{Q_PROJ}.weight"]
    assert (hf[f"{Q_PROJ}.weight"] - original).norm() < 0.2 * original.norm()  # a real 4-bit quantization


def test_load_model_refuses_a_quantized_folder(folders):
    with pytest.raises(ModelLoadError, match="must be compiled"):
        load_model(folders("gptq"))


# --- group size 128 on a wider linear ------------------------------------------------------------

def wide_linear(method: str, group: int = 128):
    """A [64, 256] linear in `method`'s layout at group size 128 -> (quant, stored tensors, library W)."""
    w = torch.randn(64, 256, generator=torch.Generator().manual_seed(1)) * 0.1
    if method == "gptq":
        q, scales, zeros, g_idx = qc.gptq_quantize(w, group, sym=False, perm=None)
        qweight, qzeros, half = qc.gptq_pack(q, scales, zeros, g_idx)
        stored = {"qweight": qweight, "qzeros": qzeros, "scales": half, "g_idx": g_idx}
        quant = CheckpointQuantization(method="gptq", scheme="int4", format="gptq", group_size=group, symmetric=False)
    elif method == "awq":
        wq, scales, zeros = qc.awq_pseudo_quantize(w.half(), group)
        qweight, qzeros, half = qc.awq_pack(wq, scales.t().contiguous(), zeros.t().contiguous(), group)
        stored = {"qweight": qweight, "qzeros": qzeros, "scales": half}
        quant = CheckpointQuantization(method="awq", scheme="int4", format="gemm", group_size=group, symmetric=False)
    else:
        scale, zp = qc.ct_int4_qparams(w, group, sym=False)
        stored = {"weight_packed": qc.ct_pack_to_int32(qc.ct_int4_quantize(w, scale, zp, group)),
                  "weight_scale": scale, "weight_shape": torch.tensor([64, 256]),
                  "weight_zero_point": qc.ct_pack_to_int32(zp, packed_dim=0)}
        quant = CheckpointQuantization(method="compressed-tensors", scheme="int4", format="pack-quantized",
                                       group_size=group, symmetric=False)
    return quant, stored, qc.dequantize_linear(method, {}, stored)


@pytest.mark.parametrize("method", ["gptq", "awq", "compressed-tensors"])
def test_group_size_128_on_a_wider_linear(method):
    quant, stored, library = wide_linear(method)
    converted = convert_linear(quant, "wide", stored, (64, 256), torch.float32)
    assert converted["scales"].shape == (2, 64)
    assert torch.equal(dequantized(converted), library)


# --- refused options -----------------------------------------------------------------------------

def ct_fp8_config(**group_edits):
    config = qc.ct_config(dict(strategy="channel"), dict(strategy="token", dynamic=True), "float-quantized",
                          ["lm_head"], None)
    config["config_groups"]["group_0"].update(group_edits)
    return config


GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128}
AWQ = {"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm", "zero_point": True}
CT_GROUP = ct_fp8_config()["config_groups"]["group_0"]


@pytest.mark.parametrize("config, option", [
    ({**GPTQ, "bits": 8}, "bits=8"),
    ({**GPTQ, "checkpoint_format": "marlin"}, "checkpoint_format='marlin'"),
    ({**GPTQ, "lm_head": True}, "lm_head=True"),
    ({**AWQ, "version": "gemv"}, "version='gemv'"),
    ({**AWQ, "zero_point": False}, "zero_point=False"),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True},
     "quant_method 'bitsandbytes'.*supported: compressed-tensors, gptq, awq, fp8"),
    ({"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}, "weight_block_size"),
    (ct_fp8_config(input_activations=None), "input_activations=None.*W8A16"),
    (ct_fp8_config(weights=dict(type="float", num_bits=8, strategy="block", block_structure=[128, 128])),
     "weights.strategy='block'"),
    (ct_fp8_config(weights=dict(type="int", num_bits=8, strategy="channel")), r"weights type/num_bits=\('int', 8\)"),
    (ct_fp8_config(targets=["re:.*mlp.*"]), "targets"),
    ({**ct_fp8_config(), "sparsity_config": {"format": "sparse-24-bitmask"}}, "sparsity_config"),
    ({**ct_fp8_config(), "kv_cache_scheme": {"type": "float", "num_bits": 8, "strategy": "attn_head"}},
     "kv_cache_scheme"),
    ({**ct_fp8_config(), "config_groups": {"a": CT_GROUP, "b": CT_GROUP}}, "config_groups"),
])
def test_unsupported_option_is_named(config, option):
    with pytest.raises(ModelLoadError, match=option):
        read_checkpoint_quantization({"quantization_config": config})


def test_desc_act_with_reordered_groups_is_refused(tmp_path):
    folder = qc.write_gptq_folder(tmp_path / "act-order", desc_act=True)
    with pytest.raises(ModelLoadError, match=r"model.layers.0.self_attn.\w_proj.g_idx.*desc_act"):
        load_checkpoint(folder)


def test_gptq_v1_zero_point_zero_is_refused():
    """v1 stores zero - 1: a zero point 0 packs as -1 and overflows into its neighbours (AutoGPTQ's pack)."""
    w = torch.rand(16, 64, generator=torch.Generator().manual_seed(0))  # all >= 0: asymmetric zero point 0
    q, scales, zeros, g_idx = qc.gptq_quantize(w, 32, sym=False, perm=None)
    qweight, qzeros, half = qc.gptq_pack(q, scales, zeros, g_idx)
    quant = CheckpointQuantization(method="gptq", scheme="int4", format="gptq", group_size=32, symmetric=False)
    with pytest.raises(ModelLoadError, match="'lin.qzeros'.*gptq_v2"):
        convert_linear(quant, "lin", {"qweight": qweight, "qzeros": qzeros, "scales": half}, (16, 64), torch.float32)


# --- damaged tensors -----------------------------------------------------------------------------

@pytest.mark.parametrize("name, suffix, damage, message", [
    ("gptq", "qweight", lambda t: t[:-1], r"has shape \(7, 64\), expected \(8, 64\)"),
    ("gptq", "scales", lambda t: t.to(torch.int32), "has dtype torch.int32"),
    ("gptq", "qzeros", None, "missing"),
    ("awq", "qzeros", lambda t: t.t().contiguous(), r"has shape \(8, 2\), expected \(2, 8\)"),
    ("ct-fp8-channel-dynamic", "weight", lambda t: t.half(), "has dtype torch.float16, expected torch.float8_e4m3fn"),
    ("ct-fp8-channel-dynamic", "weight_scale", lambda t: t[:5], r"has shape \(5, 1\)"),
    ("ct-w4a16", "weight_packed", lambda t: t.long(), "has dtype torch.int64, expected torch.int32"),
    ("ct-w4a16", "weight_shape", lambda t: torch.tensor([64, 32]), r"is \[64, 32\], the model's linear is \[64, 64\]"),
])
def test_damaged_tensor_is_named(folders, tmp_path, name, suffix, damage, message):
    folder = shutil.copytree(folders(name), tmp_path / name)
    key = f"{Q_PROJ}.{suffix}"
    rewrite(folder, lambda t: t.pop(key) if damage is None else t.update({key: damage(t[key])}))
    with pytest.raises(ModelLoadError, match=re.escape(f"'{key}'") + f" {message}|{message}.*{re.escape(key)}"):
        load_checkpoint(folder)


def test_unexpected_tensor_on_a_quantized_linear_is_named(tmp_path):
    folder = qc.write_ct_w4a16_folder(tmp_path / "w4")  # symmetric: stores no zero point
    rewrite(folder, lambda t: t.update({f"{Q_PROJ}.weight_zero_point": torch.zeros(8, 2, dtype=torch.int32)}))
    with pytest.raises(ModelLoadError, match=f"unexpected tensor '{Q_PROJ}.weight_zero_point'"):
        load_checkpoint(folder)


# --- ignore lists and lm_head --------------------------------------------------------------------

IGNORED = ("lm_head", "re:.*mlp\\.down_proj$", "model.layers.1.self_attn.o_proj")


def test_ignored_layers_load_as_float_weights(tmp_path):
    folder = qc.write_ct_fp8_folder(tmp_path / "fp8", ignore=IGNORED)
    loaded = load_checkpoint(folder)
    stored = load_file(folder / "model.safetensors")
    plain = ["model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj", "model.layers.1.self_attn.o_proj"]
    assert len(loaded.quantized) == 11 and not set(plain) & set(loaded.quantized)
    modules = dict(loaded.model.named_modules())
    assert all(torch.equal(modules[p].weight, stored[f"{p}.weight"]) for p in plain)


def test_awq_modules_to_not_convert(tmp_path):
    loaded = load_checkpoint(qc.write_awq_folder(tmp_path / "awq", modules_to_not_convert=["down_proj"]))
    assert len(loaded.quantized) == 12 and not any(p.endswith("down_proj") for p in loaded.quantized)


def test_a_layer_quantized_against_the_ignore_list_is_named(tmp_path):
    folder = qc.write_ct_fp8_folder(tmp_path / "fp8", ignore=IGNORED)
    edit_quantization(folder, lambda q: q.update(ignore=["lm_head"]))  # o_proj, down_proj are stored float, not fp8
    with pytest.raises(ModelLoadError, match=r"'model.layers.\d.\w+.\w+_proj.weight' has dtype torch.float32, "
                                             "expected torch.float8_e4m3fn"):
        load_checkpoint(folder)
    edit_quantization(folder, lambda q: q.update(ignore=["lm_head", "re:.*"]))  # every layer says float, stored fp8
    with pytest.raises(ModelLoadError, match="is stored as torch.float8_e4m3fn, expected a floating-point weight"):
        load_checkpoint(folder)


def test_quantized_lm_head_is_refused(tmp_path):
    folder = qc.write_ct_fp8_folder(tmp_path / "fp8")
    edit_quantization(folder, lambda q: q.update(ignore=[]))
    rewrite(folder, lambda t: t.update({"lm_head.weight_scale": torch.ones(128, 1)}))
    with pytest.raises(ModelLoadError, match="quantizes lm_head"):
        load_checkpoint(folder)


def edit_quantization(folder, edit) -> None:
    qc.edit_config(folder, lambda config: edit(config["quantization_config"]))


def test_gptq_modules_in_block_to_quantize():
    quant = read_checkpoint_quantization({"quantization_config": {
        "quant_method": "gptq", "bits": 4, "group_size": 128,
        "modules_in_block_to_quantize": [["self_attn.q_proj", "self_attn.k_proj"], ["mlp.up_proj"]]}})
    assert not quant.ignored("model.layers.3.self_attn.q_proj") and not quant.ignored("model.layers.0.mlp.up_proj")
    assert quant.ignored("model.layers.3.self_attn.o_proj") and quant.ignored("model.layers.0.mlp.down_proj")


# --- KV-cache scales -----------------------------------------------------------------------------

def test_kv_scales_are_read(tmp_path):
    loaded = load_checkpoint(qc.write_ct_fp8_folder(tmp_path / "kv", kv_scales=True))
    assert loaded.quantization.kv_cache_fp8 and loaded.kv_scales == {0: (0.5, 0.25), 1: (0.75, 0.375)}


def test_older_output_scale_names_are_read(tmp_path):
    folder = qc.write_ct_fp8_folder(tmp_path / "kv", kv_scales=True)

    def rename(t):
        for layer, kv in itertools.product((0, 1), "kv"):
            attention = f"model.layers.{layer}.self_attn"
            t[f"{attention}.{kv}_proj.output_scale"] = t.pop(f"{attention}.{kv}_scale")
    rewrite(folder, rename)
    assert load_checkpoint(folder).kv_scales == {0: (0.5, 0.25), 1: (0.75, 0.375)}


def test_missing_kv_scale_is_named(tmp_path):
    folder = qc.write_ct_fp8_folder(tmp_path / "kv", kv_scales=True)
    rewrite(folder, lambda t: t.pop("model.layers.1.self_attn.v_scale"))
    with pytest.raises(ModelLoadError, match="missing tensor 'model.layers.1.self_attn.v_scale'"):
        load_checkpoint(folder)


# --- the fp8 method (AutoFP8 / vLLM per-tensor) --------------------------------------------------

def test_autofp8_per_tensor_static(folders, tmp_path):
    folder = shutil.copytree(folders("ct-fp8-tensor-static"), tmp_path / "autofp8")
    qc.edit_config(folder, lambda c: c.update(quantization_config={
        "quant_method": "fp8", "activation_scheme": "static", "ignored_layers": ["lm_head"]}))
    rewrite(folder, lambda t: t.update({n: v.reshape(()) for n, v in t.items() if n.endswith("_scale")}))  # scalars
    loaded = load_checkpoint(folder)
    library = library_weights(folders("ct-fp8-tensor-static"))
    assert loaded.quantization.method == "fp8" and not loaded.quantization.input_dynamic
    assert all(torch.equal(dequantized(t), library[p]) for p, t in loaded.quantized.items())


# --- the compressed-tensors ports against the installed library ----------------------------------

def test_ct_packing_matches_the_library():
    helpers = pytest.importorskip("compressed_tensors.compressors.pack_quantized.helpers")
    values = torch.randint(-8, 8, (24, 64), dtype=torch.int8, generator=torch.Generator().manual_seed(0))
    for dim in (0, 1):
        packed = helpers.pack_to_int32(values, 4, packed_dim=dim)
        assert torch.equal(qc.ct_pack_to_int32(values, 4, dim), packed)
        assert torch.equal(qc.ct_unpack_from_int32(packed, values.shape, dim), values)


@pytest.mark.parametrize("sym", [True, False])
def test_ct_w4a16_writer_matches_the_library_compressor(sym):
    ct = pytest.importorskip("compressed_tensors")
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    args = ct.quantization.QuantizationArgs(num_bits=4, type="int", symmetric=sym, strategy="group", group_size=32)
    scheme = ct.quantization.QuantizationScheme(targets=["Linear"], weights=args)
    w = torch.randn(64, 128, generator=torch.Generator().manual_seed(0)) * 0.1
    scale, zp = qc.ct_int4_qparams(w, 32, sym)
    state = {"weight": w, "weight_scale": scale, "weight_zero_point": zp}
    compressed = PackedQuantizationCompressor.compress(state, scheme)
    assert torch.equal(compressed["weight_packed"], qc.ct_pack_to_int32(qc.ct_int4_quantize(w, scale, zp, 32)))
    assert sym or torch.equal(compressed["weight_zero_point"], qc.ct_pack_to_int32(zp, packed_dim=0))
    quant = CheckpointQuantization(method="compressed-tensors", scheme="int4", format="pack-quantized",
                                   group_size=32, symmetric=sym)
    converted = convert_linear(quant, "lin", dict(compressed), (64, 128), torch.float32)
    assert torch.equal(dequantized(converted), PackedQuantizationCompressor.decompress(compressed, scheme)["weight"])


def test_ct_fp8_writer_matches_the_library_compressor():
    ct = pytest.importorskip("compressed_tensors")
    from compressed_tensors.compressors.naive_quantized.base import FloatQuantizationCompressor
    scheme = ct.quantization.QuantizationScheme(
        targets=["Linear"], weights=ct.quantization.QuantizationArgs(num_bits=8, type="float", strategy="channel"),
        input_activations=ct.quantization.QuantizationArgs(num_bits=8, type="float", strategy="token", dynamic=True))
    w = torch.randn(64, 128, generator=torch.Generator().manual_seed(0)) * 0.1
    weight, scale = qc.ct_fp8_quantize(w, per_tensor=False)
    compressed = FloatQuantizationCompressor.compress({"weight": w, "weight_scale": scale}, scheme)
    assert torch.equal(compressed["weight"].view(torch.uint8), weight.view(torch.uint8))
    quant = read_checkpoint_quantization({"quantization_config": ct_fp8_config()})
    converted = convert_linear(quant, "lin", dict(compressed), (64, 128), torch.float32)
    assert torch.equal(dequantized(converted), FloatQuantizationCompressor.decompress(compressed, scheme)["weight"])


def test_ct_configs_validate_with_the_library(folders):
    ct = pytest.importorskip("compressed_tensors")
    for name in ("ct-fp8-tensor-static", "ct-w4a16-asym"):
        config = json.loads((folders(name) / "config.json").read_text())["quantization_config"]
        ct.QuantizationConfig.model_validate(config)
