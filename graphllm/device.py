"""Device and dtype resolution: what "auto" means, in one place below the compiler and the runtime.

    resolve_device("auto")                  -> cuda when available, else cpu
    resolve_dtype("auto", hf_config, dev)   -> float32 on CPU, else the checkpoint's half dtype
"""

from typing import Any

import torch

from graphllm.config import DTYPES


def resolve_device(name: str | torch.device) -> torch.device:
    """name: "auto", or anything torch.device takes ("cpu", "cuda", "cuda:1")."""
    if str(name) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {str(name)!r}") from e
    return device


def resolve_dtype(name: str, hf_config: dict[str, Any], device: torch.device) -> torch.dtype:
    """name: one of DTYPES. auto: float32 on CPU; on a GPU float16 if the checkpoint says so, else
    bfloat16 (hf_config: the model folder's config.json)."""
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {name!r}")
    if name != "auto":
        return getattr(torch, name)
    if device.type == "cpu":
        return torch.float32
    saved = hf_config.get("dtype") or hf_config.get("torch_dtype")
    return torch.float16 if saved == "float16" else torch.bfloat16
