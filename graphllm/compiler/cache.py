"""Compile-on-the-fly cache: `serve`/`generate --model DIR` compile once into a directory keyed
by the artifact's cache key, and reuse it on the next start.

Processes that want the same artifact at once (two servers started together on one model) compile it once:
the first takes the key's lock file (KEY.lock beside it) and compiles, the others wait on the lock, then find
the artifact complete and load it."""

import fcntl
import logging
import sys
from contextlib import contextmanager
from pathlib import Path

import torch

from graphllm.compiler.artifact import MANIFEST
from graphllm.compiler.pipeline import cache_key, compile_model
from graphllm.config import CompileConfig

logger = logging.getLogger(__name__)


def compiled_artifact(model_dir: Path, config: CompileConfig, device: torch.device, cache_dir: Path,
                      show_progress: bool = True) -> Path:
    """The artifact of model_dir under config in cache_dir, compiling it first if it is not there."""
    art = Path(cache_dir) / cache_key(model_dir, config, device)
    if (art / MANIFEST).is_file():
        return art
    with exclusive(art.with_name(art.name + ".lock"), f"another process is compiling {art}; waiting for it",
                   show_progress):
        if not (art / MANIFEST).is_file():  # else the process this one waited for compiled it
            compile_model(model_dir, art, config, device, show_progress=show_progress)
    return art


@contextmanager
def exclusive(lock: Path, waiting: str, show_progress: bool):
    """Holds an exclusive flock on the file lock (made if missing) for the block; says `waiting` first when
    another process holds it. The kernel drops the lock with its process, so a killed compile frees it."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if show_progress:
                print(waiting, file=sys.stderr, flush=True)
            logger.info(waiting)
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
