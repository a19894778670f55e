"""Loading a verified artifact: model config, post-pass weights, and the compiled step."""

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import torch
import graphllm.ops.attention  # noqa: F401  (register the ops a compiled step may call)
import graphllm.ops.collectives  # noqa: F401
import graphllm.ops.linear  # noqa: F401
import graphllm.ops.moe  # noqa: F401
import graphllm.ops.quantized_linear  # noqa: F401
import graphllm.ops.rms_norm  # noqa: F401
import graphllm.ops.silu_and_mul  # noqa: F401
from graphllm.compiler import artifact as A
from graphllm.compiler.inductor_lowering import STEP_INDUCTOR, bind_inductor_step, load_inductor_artifact
from graphllm.compiler.lower import load_package
from graphllm.compiler.weights_io import ChunkMismatch, read_safetensors
from graphllm.models.registry import resolve_architecture


DEVICE_ERRORS = tuple(e for e in (getattr(torch, "AcceleratorError", None),) if e is not None)


def load_weights(art: Path, manifest: dict, device: torch.device, rank: int = 0) -> dict[str, torch.Tensor]:
    """The weights of tensor-parallel rank `rank` (its own file: a rank reads only its shard), read in
    parallel straight to the device, each chunk checked against the manifest's sha256 as it is read."""
    name = A.rank_weights(rank)
    path = art / name
    chunk_bytes, hashes = A.chunk_hashes(A.listed_files(art, manifest)[name])
    try:
        weights = read_safetensors(path, device, hashes, chunk_bytes)
    except DEVICE_ERRORS:  # a device fault (e.g. an earlier kernel's assert) is not a damaged file
        raise
    except ChunkMismatch as e:
        raise A.damaged(art, manifest, name, "sha256") from e
    except (ValueError, KeyError, TypeError, OSError) as e:  # not safetensors (its header checked out: a bug)
        raise A.ArtifactError(f"{path} is damaged ({e}). {A.recompile_hint(manifest, art)}") from e
    aliases = manifest.get("weight_aliases", {})
    weights.update({alias: weights[stored] for alias, stored in aliases.items()})
    return weights


def load_compiled_step(art: Path, manifest: dict, device: torch.device, rank: int = 0,
                       lap: Callable[[str], None] = lambda phase: None):
    """(ModelConfig, weights by name, the compiled step callable) of tensor-parallel rank `rank`; lap(phase)
    is called as they load (start-up timings). The inductor lowering's compiled step loads while the weights
    stream in on their reader threads (it takes them only when bound): "step" is the time to load it, then
    "weights" what is left of reading them; the AOTInductor package (CPU) takes its weights as it loads."""
    # the max_model_len it was compiled for: LongRoPE's factors are baked into the step
    _, model_config = resolve_architecture(manifest["model"]["config"], manifest["compile"]["max_model_len"])
    lowered = manifest["lowering"]
    if lowered["kind"] != "inductor":
        weights = load_weights(art, manifest, device, rank)
        lap("weights")
        step = load_package(art / A.STEP_PACKAGE, weights, device)
        lap("step")
        return model_config, weights, step
    with ThreadPoolExecutor(1) as reader:
        reading = reader.submit(load_weights, art, manifest, device, rank)
        try:
            compiled = load_inductor_artifact(art / STEP_INDUCTOR)
        finally:
            lap("step")
            weights = reading.result()  # raises what reading raised (a damaged file) once the step is loaded
    lap("weights")
    return model_config, weights, bind_inductor_step(compiled, lowered["weight_names"], weights)
