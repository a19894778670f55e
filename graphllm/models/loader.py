"""Hugging Face model folder -> nn.Module with its weights, without ever unpickling.

The module is built on the meta device, then every parameter is assigned from safetensors
(single file or sharded with model.safetensors.index.json) in the requested dtype. Every
mismatch between checkpoint and module is an error that names the tensor.

A pre-quantized folder (compressed-tensors, GPTQ, AWQ, fp8: graphllm/models/quantization/) loads
through load_checkpoint: each quantized linear's weight parameter is a zero-memory placeholder of
its shape, and its tensors in graphllm's internal layout come beside the model, for the compiler's
quantization pass to put in place of the linear. Quantized MoE experts (fp8, one linear per expert) are
the same: their stacked parameters are placeholders, their float8 stacks come beside the model, for
quantize_fp8_experts.
"""

import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, NamedTuple

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from graphllm.models.checkpoint_parts import CheckpointPart, StackedTensors, checkpoint_parts
from graphllm.models.config import ModelConfig
from graphllm.models.errors import ModelLoadError
from graphllm.models.quantization import (CheckpointQuantization, QuantizedTensors, quantized_experts,
                                          quantized_linears, read_checkpoint_quantization)
from graphllm.models.registry import resolve_architecture

# Checkpoint entries that carry no weights (old Llama checkpoints saved the rope buffer).
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)

__all__ = ["LoadedCheckpoint", "ModelLoadError", "load_checkpoint", "load_model", "read_hf_config", "weight_files"]


@dataclass
class LoadedCheckpoint:
    """A loaded model folder. For a quantized checkpoint, `quantized` maps each quantized linear's module
    path ("model.layers.0.self_attn.q_proj") to its tensors in graphllm's internal layout
    (graphllm/kernels/quant_layout.py): {"qweight", "weight_scale", "input_scale"?} for fp8, {"qweight",
    "scales", "zeros"} for int4, plus "bias" where the linear has one; that linear's weight parameter in
    `model` is a zero-memory placeholder. `experts` maps each quantized MoE expert stack
    ("model.layers.0.mlp.experts.gate_up_proj" / ".down_proj") to {"qweight": float8 [E, N, K], "weight_scale":
    float32 [E, N]} (models/quantization/experts.py); that stack in `model` is a placeholder too. `kv_scales`
    maps a layer to its fp8 KV-cache (k_scale, v_scale)."""
    model: nn.Module
    config: ModelConfig
    quantization: CheckpointQuantization | None = None
    quantized: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    experts: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    kv_scales: dict[int, tuple[float, float]] = field(default_factory=dict)


ARTIFACT_MANIFEST = "manifest.json"  # compiler/artifact.py's MANIFEST (models/ does not import the compiler)


def read_hf_config(path: Path) -> dict[str, Any]:
    config_file = path / "config.json"
    if not path.is_dir():
        raise ModelLoadError(f"model folder {path} does not exist or is not a directory")
    if (path / ARTIFACT_MANIFEST).is_file():  # its config.json is there too, and its weights would read as stray
        raise ModelLoadError(f"{path} is a compiled graphllm artifact ({ARTIFACT_MANIFEST}), not a model folder: "
                             "run it with --artifact (Engine.load in Python)")
    if not config_file.is_file():
        raise ModelLoadError(f"{path} has no config.json; expected a Hugging Face model folder")
    return read_json_object(config_file)


def read_json_object(file: Path) -> dict[str, Any]:
    """A JSON file that must hold an object; a message naming the file otherwise."""
    try:
        value = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelLoadError(f"{file} is not valid JSON: {e}") from e
    if not isinstance(value, dict):
        raise ModelLoadError(f"{file} must hold a JSON object, got a {type(value).__name__}")
    return value


@contextlib.contextmanager
def safetensors_file(file: Path):
    """safe_open, with a truncated or corrupt file (or a folder of that name) a ModelLoadError naming it."""
    try:
        with safe_open(file, framework="pt", device="cpu") as f:
            yield f
    except (SafetensorError, OSError) as e:
        raise ModelLoadError(f"{file} is not a readable safetensors file: {e}") from e


def weight_files(path: Path) -> list[Path]:
    """The safetensors files of a folder; refuses pickle-only folders."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json_object(index).get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise ModelLoadError(f"{index} needs a 'weight_map' object of tensor name -> shard file name")
        names = sorted(set(weight_map.values()))
        missing = [n for n in names if not (path / n).is_file()]
        if missing:
            raise ModelLoadError(f"{index.name} lists shard(s) missing from {path}: {', '.join(missing)}")
        return [path / n for n in names]
    files = sorted(path.glob("*.safetensors"))
    if files:
        return files
    if any(f.suffix in PICKLE_SUFFIXES for f in path.iterdir()):
        raise ModelLoadError(
            f"{path} holds only PyTorch pickle weights (.bin/.pt); graphllm never unpickles "
            "checkpoints. Convert them to safetensors first (e.g. save_pretrained(..., "
            "safe_serialization=True)).")
    raise ModelLoadError(f"{path} has no *.safetensors weight files")


def read_checkpoint(files: list[Path], expected: dict[str, nn.Parameter], skip: set[str],
                    dtype: torch.dtype, device: torch.device,
                    claims: Callable[[str], bool] = lambda name: False,
                    parts: dict[str, CheckpointPart] | None = None,
                    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Every expected tensor from the files, checked for name, shape and a float dtype, in `dtype` on
    `device`; apart, as stored (CPU, own dtype), the tensors whose name `claims` (quantized ones). A stacked
    parameter is assembled from its `parts` (per-expert tensors: models/checkpoint_parts.py) or read whole."""
    tensors: dict[str, torch.Tensor] = {}
    claimed: dict[str, torch.Tensor] = {}
    seen: dict[str, Path] = {}  # a tensor in two files: which one wins would be the files' order (s35's fuzzing)
    stacked = StackedTensors(parts or {}, expected, dtype, device)
    for file in files:
        with safetensors_file(file) as f:
            for name in f.keys():
                if name in seen:
                    raise ModelLoadError(f"tensor {name!r} is stored twice, in {seen[name].name} and {file.name}: "
                                         "remove the stale file (or fix model.safetensors.index.json)")
                seen[name] = file
                if name.endswith(IGNORED_SUFFIXES) or name in skip:
                    continue
                if claims(name):
                    claimed[name] = f.get_tensor(name)
                    continue
                if stacked.claims(name):
                    stacked.put(name, f.get_tensor(name), file)
                    continue
                if name not in expected:
                    raise ModelLoadError(f"unexpected tensor {name!r} in {file.name}: the model has no such parameter")
                tensor = f.get_tensor(name)
                check_parameter_tensor(name, file, tensor, expected[name])
                tensors[name] = tensor.to(device=device, dtype=dtype)
    tensors.update(stacked.finish(set(tensors)))
    missing = sorted(set(expected) - set(tensors))
    if missing:
        raise ModelLoadError(f"checkpoint is missing tensor(s): {', '.join(missing[:10])}"
                             + (f" and {len(missing) - 10} more" if len(missing) > 10 else ""))
    return tensors, claimed


def check_parameter_tensor(name: str, file: Path, tensor: torch.Tensor, parameter: nn.Parameter) -> None:
    if tensor.shape != parameter.shape:
        raise ModelLoadError(
            f"tensor {name!r} in {file.name} has shape {tuple(tensor.shape)}, "
            f"the model expects {tuple(parameter.shape)}")
    if tensor.dtype not in FLOAT_DTYPES:  # e.g. a quantized layer that the config's ignore list keeps float
        raise ModelLoadError(f"tensor {name!r} in {file.name} is stored as {tensor.dtype}, expected a floating-point "
                             "weight: the checkpoint's quantization config (if any) does not quantize it")


def load_checkpoint(path: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                    max_model_len: int | None = None) -> LoadedCheckpoint:
    """Build the model of a Hugging Face folder, plain or pre-quantized, and fill it with its weights; built for
    an engine of max_model_len tokens (None: the model's max_position_embeddings; LongRoPE's factors depend on it)."""
    path, device = Path(path), torch.device(device)
    hf = read_hf_config(path)
    module_cls, config = resolve_architecture(hf, max_model_len)
    quant = read_checkpoint_quantization(hf)
    files = weight_files(path)
    with torch.device("meta"):
        model = module_cls(config)
    linears = quantized_linears(model, quant) if quant else {}
    experts = quantized_experts(model, quant) if quant else {}
    stacks = {expert.part.parameter: expert.stack for expert in experts.values()}  # [E, N, K] each
    placeholders = {f"{prefix}.weight" for prefix in linears} | set(stacks)
    expected = {n: p for n, p in model.named_parameters() if n not in placeholders}  # tied lm_head appears once
    skip = {"lm_head.weight"} if config.tie_word_embeddings else set()
    router = QuantizedTensors(quant, linears, experts) if quant else None
    claims = router.claims if router else (lambda name: False)
    parts = {name: part for name, part in checkpoint_parts(model).items() if part.parameter not in stacks}
    tensors, claimed = read_checkpoint(files, expected, skip, dtype, device, claims, parts)
    if router is None:
        return LoadedCheckpoint(fill_model(model, config, tensors, device), config)
    quantized = router.convert(claimed, dtype, device)
    for prefix, (n, k) in linears.items():
        tensors[f"{prefix}.weight"] = torch.zeros((), dtype=dtype, device=device).expand(n, k)  # no memory
        if f"{prefix}.bias" in tensors:
            quantized[prefix]["bias"] = tensors[f"{prefix}.bias"]
    for name, shape in stacks.items():
        tensors[name] = torch.zeros((), dtype=dtype, device=device).expand(shape)
    return LoadedCheckpoint(fill_model(model, config, tensors, device), config, quant, quantized,
                            router.convert_experts(claimed, dtype, device),
                            router.kv_scales(claimed, config.num_hidden_layers))


def fill_model(model: nn.Module, config: ModelConfig, tensors: dict[str, torch.Tensor],
               device: torch.device) -> nn.Module:
    """Assign the tensors to the meta-built model, tie the head, rebuild buffers on `device`."""
    model.load_state_dict(tensors, strict=False, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    for module in model.modules():
        if hasattr(module, "reset_buffers"):
            module.reset_buffers(device)
    return model.eval().requires_grad_(False)


def load_model(path: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
               max_model_len: int | None = None) -> tuple[nn.Module, ModelConfig]:
    """Build the model of an unquantized Hugging Face folder and fill it with its safetensors weights.

    A pre-quantized folder is refused: its linears only run through the compiler's quantization pass
    (load it with load_checkpoint)."""
    quant = read_checkpoint_quantization(read_hf_config(Path(path)))
    if quant is not None:
        raise ModelLoadError(f"{path} is a pre-quantized checkpoint ({quant.method}, {quant.scheme}): quantized "
                             "checkpoints must be compiled (the compiler's quantization pass applies them); "
                             "load_checkpoint reads them")
    loaded = load_checkpoint(path, dtype, device, max_model_len)
    return loaded.model, loaded.config


class RankSlice(NamedTuple):
    """A tensor-parallel rank's part of a weight: `length` entries of dimension `dim` from `start` (entries past
    the tensor's end are zeros: a padded vocabulary), or, with `zeros`, nothing of it (a row-parallel bias
    that rank 0 alone adds)."""
    dim: int
    start: int
    length: int
    zeros: bool = False


def load_model_shapes(path: str | Path, dtype: torch.dtype = torch.float32,
                      device: str | torch.device = "cpu") -> tuple[nn.Module, ModelConfig]:
    """The model of an unquantized folder with every parameter a zero placeholder of its shape that holds no
    memory (its buffers are real): enough to capture the step, then read only a rank's slices into it."""
    path, device = Path(path), torch.device(device)
    module_cls, config = resolve_architecture(read_hf_config(path))
    with torch.device("meta"):
        model = module_cls(config)
    placeholders = {name: torch.zeros((), dtype=dtype, device=device).expand(p.shape)
                    for name, p in model.named_parameters()}
    return fill_model(model, config, placeholders, device), config


def read_rank_tensors(path: str | Path, wanted: dict[str, RankSlice | None], dtype: torch.dtype,
                      device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """{checkpoint name: the tensor, or its RankSlice} read with safetensors' get_slice: a rank reads its rows
    or columns of a sharded weight and nothing else of it (None: the whole tensor)."""
    where = {}
    for file in weight_files(Path(path)):
        with safetensors_file(file) as f:
            where.update({name: file for name in f.keys()})
    missing = sorted(set(wanted) - set(where))
    if missing:
        raise ModelLoadError(f"checkpoint is missing tensor(s): {', '.join(missing[:10])}")
    out = {}
    for file in sorted(set(where[name] for name in wanted)):
        with safetensors_file(file) as f:
            for name in [n for n in wanted if where[n] == file]:
                part = wanted[name]
                if part is None:
                    tensor = f.get_tensor(name)
                else:
                    tensor = _read_slice(f.get_slice(name), part)
                out[name] = tensor.to(device=device, dtype=dtype)
    return out


def _read_slice(view, part: RankSlice) -> torch.Tensor:
    """The RankSlice of a safetensors slice view, zero-padded past the tensor's end."""
    shape = view.get_shape()
    out_shape = list(shape)
    out_shape[part.dim] = part.length
    if part.zeros:
        return torch.zeros(out_shape)
    stop = min(part.start + part.length, shape[part.dim])
    index = [slice(None)] * len(shape)
    index[part.dim] = slice(part.start, stop)
    have = view[tuple(index)]
    if stop - part.start == part.length:
        return have
    out = have.new_zeros(out_shape)
    out.narrow(part.dim, 0, stop - part.start).copy_(have)
    return out
