"""Compile-on-the-fly cache: `serve`/`generate --model DIR` compile once into a directory keyed
by the artifact's cache key, and reuse it on the next start."""

import os
from pathlib import Path

from graphllm.config import DEFAULT_LIMITS, CompileConfig, EngineConfig


def cache_root() -> Path:
    root = os.environ.get("GRAPHLLM_CACHE_DIR") or Path.home() / ".cache" / "graphllm"
    return Path(root) / "artifacts"


def compile_config_for(config: EngineConfig) -> CompileConfig:
    limits = {name: getattr(config, name) for name in DEFAULT_LIMITS if getattr(config, name) is not None}
    return CompileConfig(dtype=config.dtype, max_model_len=config.max_model_len, **limits)


def compiled_artifact(config: EngineConfig, model_dir: Path, show_progress: bool = True) -> Path:
    """The cached artifact for model_dir under config, compiling it first if it is not there."""
    from graphllm.compiler.pipeline import cache_key, compile_model
    from graphllm.runtime.setup import resolve_device
    compile_config = compile_config_for(config)
    device = resolve_device(config)
    art = cache_root() / cache_key(model_dir, compile_config, device)
    if not (art / "manifest.json").is_file():
        compile_model(model_dir, art, compile_config, device, show_progress=show_progress)
    return art
