"""Loading a verified artifact: model config, post-pass weights, and the compiled step."""

from pathlib import Path

import torch
from safetensors import safe_open

import graphllm.ops.attention  # noqa: F401  (register the ops a compiled step may call)
import graphllm.ops.collectives  # noqa: F401
import graphllm.ops.linear  # noqa: F401
import graphllm.ops.quantized_linear  # noqa: F401
import graphllm.ops.rms_norm  # noqa: F401
import graphllm.ops.silu_and_mul  # noqa: F401
from graphllm.compiler import artifact as A
from graphllm.compiler.inductor_lowering import STEP_INDUCTOR, load_inductor_step
from graphllm.compiler.lower import load_package
from graphllm.models.registry import resolve_architecture


DEVICE_ERRORS = tuple(e for e in (getattr(torch, "AcceleratorError", None),) if e is not None)


def load_weights(art: Path, aliases: dict[str, str], device: torch.device, rank: int = 0) -> dict[str, torch.Tensor]:
    """The weights of tensor-parallel rank `rank` (its own file: a rank reads only its shard)."""
    path = art / A.rank_weights(rank)
    try:
        with safe_open(path, framework="pt", device=str(device)) as f:
            weights = {name: f.get_tensor(name) for name in f.keys()}
    except DEVICE_ERRORS:  # a device fault (e.g. an earlier kernel's assert) is not a damaged file
        raise
    except Exception as e:  # safetensors raises its own error types for damaged files
        raise A.ArtifactError(f"{path} is damaged ({e}). {A.recompile_hint(None, art)}") from e
    weights.update({alias: weights[name] for alias, name in aliases.items()})
    return weights


def load_compiled_step(art: Path, manifest: dict, device: torch.device, rank: int = 0):
    """(ModelConfig, weights by name, the compiled step callable) of tensor-parallel rank `rank`."""
    _, model_config = resolve_architecture(manifest["model"]["config"])
    weights = load_weights(art, manifest.get("weight_aliases", {}), device, rank)
    lowered = manifest["lowering"]
    if lowered["kind"] == "inductor":
        step = load_inductor_step(art / STEP_INDUCTOR, lowered["weight_names"], weights)
    else:
        step = load_package(art / A.STEP_PACKAGE, weights, device)
    return model_config, weights, step
