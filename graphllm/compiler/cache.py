"""Compile-on-the-fly cache: `serve`/`generate --model DIR` compile once into a directory keyed
by the artifact's cache key, and reuse it on the next start."""

from pathlib import Path

import torch

from graphllm.compiler.pipeline import cache_key, compile_model
from graphllm.config import CompileConfig


def compiled_artifact(model_dir: Path, config: CompileConfig, device: torch.device, cache_dir: Path,
                      show_progress: bool = True) -> Path:
    """The artifact of model_dir under config in cache_dir, compiling it first if it is not there."""
    art = Path(cache_dir) / cache_key(model_dir, config, device)
    if not (art / "manifest.json").is_file():
        compile_model(model_dir, art, config, device, show_progress=show_progress)
    return art
