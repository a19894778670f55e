"""config.json `quantization_config` -> CheckpointQuantization, or a ModelLoadError naming the option.

Supported, each mapped onto one internal layout (graphllm/kernels/quant_layout.py):

    method              on disk                                       scheme
    compressed-tensors  float-/naive-quantized fp8 W8A8               fp8   (weight scale per tensor or channel;
                                                                             activations per token or static)
    compressed-tensors  pack-quantized int4 W4A16                     int4  (group or channel, sym or asym)
    gptq                bits 4, formats gptq (v1) and gptq_v2         int4  (any group size; desc_act only
                                                                             where g_idx is trivial)
    awq                 version gemm, bits 4, zero_point              int4
    fp8                 AutoFP8 / vLLM per-tensor fp8                 fp8   (block-wise fp8 refused)

Everything else (other bit widths, block-wise scales, sparsity, transforms, bitsandbytes, ...)
is refused by name rather than loaded wrong, and so is an option of the wrong JSON type (an ignore
list given as a string would otherwise be read as a list of its characters).
"""

import re
from typing import Any, Callable

from graphllm.models.errors import ModelLoadError
from graphllm.models.quantization.scheme import CheckpointQuantization

Config = dict[str, Any]
TRIVIAL_ACTORDER = (None, False, "weight", "static")  # compressed-tensors: these store no g_idx


def read_checkpoint_quantization(hf_config: Config) -> CheckpointQuantization | None:
    """The checkpoint's quantization from config.json (`quantization_config`, or the older
    `compression_config`), None for an unquantized checkpoint."""
    qc = hf_config.get("quantization_config") or hf_config.get("compression_config")
    if not qc:
        return None
    qc = options("quantization_config", qc)
    method = qc.get("quant_method")
    if not isinstance(method, str) or method not in PARSERS:
        raise ModelLoadError(f"config.json quantization_config: quant_method {method!r} is not supported "
                             f"(supported: {', '.join(PARSERS)})")
    return PARSERS[method](qc)


def refuse(method: str, option: str, value: Any, supported: str) -> ModelLoadError:
    return ModelLoadError(f"config.json quantization_config ({method}): {option}={value!r} is not supported "
                          f"(supported: {supported})")


def options(key: str, value: Any) -> Config:
    """An object-valued option ({} where it is null or absent); another JSON type is refused by name."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ModelLoadError(f"config.json: {key} must be a JSON object, got {type(value).__name__} {value!r}")
    return value


def names(key: str, value: Any) -> tuple[str, ...]:
    """A list of module names (() where it is null or absent); a string or another type is refused by name."""
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise ModelLoadError(f"config.json: {key} must be a list of module names, got {value!r}")
    return tuple(value)


def positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


# --- compressed-tensors --------------------------------------------------------------------------

def parse_compressed_tensors(qc: Config) -> CheckpointQuantization:
    method = "compressed-tensors"
    for key in ("sparsity_config", "transform_config"):
        if qc.get(key):
            raise refuse(method, key, qc[key], "none: dense weights without transforms")
    groups = options("quantization_config.config_groups", qc.get("config_groups"))
    if len(groups) != 1 or not isinstance(next(iter(groups.values())), dict):
        raise refuse(method, "config_groups", groups, "exactly one scheme, for every Linear")
    name, group = next(iter(groups.items()))
    if group.get("targets") != ["Linear"]:
        raise refuse(method, "targets", group.get("targets"), '["Linear"]')
    if group.get("output_activations"):
        raise refuse(method, "output_activations", group["output_activations"], "none")
    key = f"quantization_config.config_groups.{name}"
    weights, fmt = options(f"{key}.weights", group.get("weights")), group.get("format") or qc.get("format")
    acts = options(f"{key}.input_activations", group.get("input_activations"))
    common = dict(method=method, format=fmt, ignore=names("quantization_config.ignore", qc.get("ignore")),
                  kv_cache_fp8=ct_kv_cache_fp8(options("quantization_config.kv_cache_scheme",
                                                       qc.get("kv_cache_scheme"))))
    kind = (weights.get("type"), weights.get("num_bits"))
    if weights.get("dynamic"):
        raise refuse(method, "weights.dynamic", weights["dynamic"], "false")
    if kind == ("float", 8):
        return ct_fp8(weights, acts, fmt, common)
    if kind == ("int", 4):
        return ct_int4(weights, acts, fmt, common)
    raise refuse(method, "weights type/num_bits", kind, "float 8 (fp8) or int 4 (W4A16)")


def ct_fp8(weights: Config, acts: Config, fmt: str, common: Config) -> CheckpointQuantization:
    method = "compressed-tensors"
    if fmt not in ("float-quantized", "naive-quantized"):
        raise refuse(method, "format", fmt, "float-quantized or naive-quantized for fp8 weights")
    if weights.get("strategy") not in ("tensor", "channel"):
        raise refuse(method, "weights.strategy", weights.get("strategy"), "tensor or channel for fp8")
    if not weights.get("symmetric", True):
        raise refuse(method, "weights.symmetric", False, "true for fp8")
    if not acts:
        raise refuse(method, "input_activations", None,
                     "fp8 activations (W8A8); weight-only fp8 (W8A16) is not offered")
    mode = (acts.get("type"), acts.get("num_bits"), acts.get("strategy"), acts.get("dynamic"))
    if mode not in (("float", 8, "token", True), ("float", 8, "tensor", False)) or not acts.get("symmetric", True):
        raise refuse(method, "input_activations (type, num_bits, strategy, dynamic)", mode,
                     "float 8 per token dynamic, or float 8 per tensor static")
    return CheckpointQuantization(scheme="fp8", input_dynamic=bool(acts["dynamic"]),
                                  weight_per_tensor=weights["strategy"] == "tensor", **common)


def ct_int4(weights: Config, acts: Config, fmt: str, common: Config) -> CheckpointQuantization:
    method = "compressed-tensors"
    if fmt != "pack-quantized":
        raise refuse(method, "format", fmt, "pack-quantized for int4 weights")
    if acts:
        raise refuse(method, "input_activations", acts, "none for int4 weights (W4A16)")
    strategy = weights.get("strategy")
    if strategy not in ("group", "channel"):
        raise refuse(method, "weights.strategy", strategy, "group or channel for int4")
    group_size = weights.get("group_size") if strategy == "group" else None
    if strategy == "group" and not positive_int(group_size):
        raise refuse(method, "weights.group_size", group_size, "a positive group size")
    return CheckpointQuantization(scheme="int4", group_size=group_size, symmetric=bool(weights.get("symmetric", True)),
                                  act_order=weights.get("actorder") not in TRIVIAL_ACTORDER, **common)


def ct_kv_cache_fp8(kv: Config) -> bool:
    """kv_cache_scheme: only fp8 with one static scale per tensor (k_scale, v_scale per layer)."""
    if not kv:
        return False
    mode = (kv.get("type"), kv.get("num_bits"), kv.get("strategy"), bool(kv.get("dynamic")))
    if mode != ("float", 8, "tensor", False):
        raise refuse("compressed-tensors", "kv_cache_scheme (type, num_bits, strategy, dynamic)", mode,
                     "float 8 per tensor static")
    return True


# --- GPTQ and AWQ --------------------------------------------------------------------------------

def int4_group_size(method: str, key: str, value: Any) -> int | None:
    if value == -1:
        return None
    if not positive_int(value):
        raise refuse(method, key, value, "-1 (per channel) or a positive group size")
    return value


def parse_gptq(qc: Config) -> CheckpointQuantization:
    method = "gptq"
    if qc.get("bits") != 4:
        raise refuse(method, "bits", qc.get("bits"), "4")
    fmt = qc.get("checkpoint_format") or qc.get("format") or "gptq"
    if fmt not in ("gptq", "gptq_v2"):
        raise refuse(method, "checkpoint_format", fmt, "gptq or gptq_v2")
    for key in ("lm_head", "dynamic"):
        if qc.get(key):
            raise refuse(method, key, qc[key], "false / none: lm_head unquantized, one setting for every layer")
    group_size = int4_group_size(method, "group_size", qc.get("group_size"))
    return CheckpointQuantization(
        method=method, scheme="int4", format=fmt, group_size=group_size,
        symmetric=bool(qc.get("sym", True)), act_order=bool(qc.get("desc_act")),
        ignore=gptq_unlisted_modules(qc.get("modules_in_block_to_quantize")))


def gptq_unlisted_modules(listed: Any) -> tuple[str, ...]:
    """modules_in_block_to_quantize ([["self_attn.q_proj", ...], ["mlp.up_proj"], ...], or one flat list) -> an
    ignore rule matching every layer's linear that is not listed."""
    key = "quantization_config.modules_in_block_to_quantize"
    if not listed:
        return ()
    if not isinstance(listed, list):
        raise ModelLoadError(f"config.json: {key} must be a list of lists of module names, got {listed!r}")
    blocks = [names(key, block) if isinstance(block, list) else names(key, [block]) for block in listed]
    listed = sorted({name for block in blocks for name in block})
    return (r"re:model\.layers\.\d+\.(?!(?:" + "|".join(map(re.escape, listed)) + r")$)",)


def parse_awq(qc: Config) -> CheckpointQuantization:
    method = "awq"
    key = "version" if qc.get("version") is not None else "format"  # transformers 5 writes format (version: legacy)
    if str(qc.get(key) or "gemm").lower() != "gemm":
        raise refuse(method, key, qc.get(key), "gemm")
    if qc.get("backend") == "llm-awq":  # transformers: the llm-awq packing, whatever version says
        raise refuse(method, "backend", qc["backend"], "AutoAWQ's gemm packing")
    bits = qc.get("bits", qc.get("w_bit"))
    if bits != 4:
        raise refuse(method, "bits", bits, "4")
    if not qc.get("zero_point", True):
        raise refuse(method, "zero_point", qc.get("zero_point"), "true")
    group_size = int4_group_size(method, "group_size", qc.get("group_size", qc.get("q_group_size")))
    skipped = names("quantization_config.modules_to_not_convert", qc.get("modules_to_not_convert"))  # substrings
    return CheckpointQuantization(method=method, scheme="int4", format="gemm", group_size=group_size,
                                  symmetric=False, ignore=tuple("re:.*" + re.escape(s) for s in skipped))


# --- fp8 (AutoFP8 / vLLM) ------------------------------------------------------------------------

def parse_fp8(qc: Config) -> CheckpointQuantization:
    method = "fp8"
    if qc.get("weight_block_size"):
        raise refuse(method, "weight_block_size", qc["weight_block_size"],
                     "none: block-wise fp8 (weight_scale_inv) is not supported, only one scale per tensor")
    scheme = qc.get("activation_scheme", "dynamic")
    if scheme not in ("dynamic", "static"):
        raise refuse(method, "activation_scheme", scheme, "dynamic or static")
    return CheckpointQuantization(method=method, scheme="fp8", format="fp8", input_dynamic=scheme == "dynamic",
                                  weight_per_tensor=True,
                                  ignore=names("quantization_config.ignored_layers", qc.get("ignored_layers")))


PARSERS: dict[str, Callable[[Config], CheckpointQuantization]] = {
    "compressed-tensors": parse_compressed_tensors,
    "gptq": parse_gptq,
    "awq": parse_awq,
    "fp8": parse_fp8,
}
