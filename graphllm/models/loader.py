"""Hugging Face model folder -> nn.Module with its weights, without ever unpickling.

The module is built on the meta device, then every parameter is assigned from safetensors
(single file or sharded with model.safetensors.index.json) in the requested dtype. Every
mismatch between checkpoint and module is an error that names the tensor.
"""

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn

from graphllm.models.config import ModelConfig
from graphllm.models.registry import resolve_architecture

# Checkpoint entries that carry no weights (old Llama checkpoints saved the rope buffer).
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")


class ModelLoadError(ValueError):
    """A model folder that cannot be loaded; the message names the file or tensor at fault."""


def read_hf_config(path: Path) -> dict[str, Any]:
    config_file = path / "config.json"
    if not path.is_dir():
        raise ModelLoadError(f"model folder {path} does not exist or is not a directory")
    if not config_file.is_file():
        raise ModelLoadError(f"{path} has no config.json; expected a Hugging Face model folder")
    try:
        return json.loads(config_file.read_text())
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{config_file} is not valid JSON: {e}") from e


def weight_files(path: Path) -> list[Path]:
    """The safetensors files of a folder; refuses pickle-only folders."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
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
                    dtype: torch.dtype, device: torch.device) -> dict[str, torch.Tensor]:
    """Every expected tensor from the files, checked for name and shape, in `dtype` on `device`."""
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(file, framework="pt", device="cpu") as f:
            for name in f.keys():
                if name.endswith(IGNORED_SUFFIXES) or name in skip:
                    continue
                if name not in expected:
                    raise ModelLoadError(f"unexpected tensor {name!r} in {file.name}: the model has no such parameter")
                tensor = f.get_tensor(name)
                if tensor.shape != expected[name].shape:
                    raise ModelLoadError(
                        f"tensor {name!r} in {file.name} has shape {tuple(tensor.shape)}, "
                        f"the model expects {tuple(expected[name].shape)}")
                tensors[name] = tensor.to(device=device, dtype=dtype)
    missing = sorted(set(expected) - set(tensors))
    if missing:
        raise ModelLoadError(f"checkpoint is missing tensor(s): {', '.join(missing[:10])}"
                             + (f" and {len(missing) - 10} more" if len(missing) > 10 else ""))
    return tensors


def load_model(path: str | Path, dtype: torch.dtype = torch.float32,
               device: str | torch.device = "cpu") -> tuple[nn.Module, ModelConfig]:
    """Build the model of a Hugging Face folder and fill it with its safetensors weights."""
    path, device = Path(path), torch.device(device)
    hf = read_hf_config(path)
    module_cls, config = resolve_architecture(hf)
    files = weight_files(path)
    with torch.device("meta"):
        model = module_cls(config)
    expected = dict(model.named_parameters())  # tied lm_head appears once, as the embedding
    skip = {"lm_head.weight"} if config.tie_word_embeddings else set()
    tensors = read_checkpoint(files, expected, skip, dtype, device)
    model.load_state_dict(tensors, strict=False, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    for module in model.modules():
        if hasattr(module, "reset_buffers"):
            module.reset_buffers(device)
    return model.eval().requires_grad_(False), config
