"""Compile-on-the-fly cache: `serve`/`generate --model DIR` compile once into a directory keyed
by the artifact's cache key, and reuse it on the next start.

Processes that want the same artifact at once (two servers started together on one model) compile it once:
the first takes the key's lock file (KEY.lock beside it) and compiles, the others wait on the lock, then find
the artifact complete and load it."""

import shutil
from pathlib import Path

import torch

from graphllm.compiler.artifact import MANIFEST
from graphllm.compiler.pipeline import cache_key, compile_model
from graphllm.compiler.staging import exclusive
from graphllm.config import CompileConfig


def compiled_artifact(model_dir: Path, config: CompileConfig, device: torch.device, cache_dir: Path,
                      show_progress: bool = True) -> Path:
    """The artifact of model_dir under config in cache_dir, compiling it first if it is not there."""
    art = Path(cache_dir) / cache_key(model_dir, config, device)
    if (art / MANIFEST).is_file():
        return art
    with exclusive(art.with_name(art.name + ".lock"), f"another process is compiling {art}; waiting for it",
                   show_progress):
        if not (art / MANIFEST).is_file():  # else the process this one waited for compiled it
            # the cache's own folder, damaged (no manifest): compile_model replaces only artifacts
            shutil.rmtree(art, ignore_errors=True)
            compile_model(model_dir, art, config, device, show_progress=show_progress)
    return art
