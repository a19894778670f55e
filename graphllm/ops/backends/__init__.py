"""Attention backends: who runs `torch.ops.graphllm.attention` at run time.

The op is one opaque node in every graph (eager, AOTInductor, Inductor), so the same compiled
artifact runs with any backend. The runtime picks one (`select_backend`), plans it on the host
before each step or CUDA-graph replay (`plan`), and makes it active for the step with the scoped
`use_backend`. Outside such a scope (tracing, pass checks, tests calling the model directly)
the op runs the PyTorch reference.

  torch       the reference of graphllm/ops/attention.py: float32 over gathered pages (CPU, oracle)
  triton      graphllm/kernels: store_kv + split-KV paged decode / paged prefill (no host planning)
  flashinfer  FlashInfer's paged decode and prefill wrappers, planned on the host; CUDA-graph
              decode uses one fixed-buffer wrapper per batch bucket

The torch and triton backends write and read a cache of the model's dtype or a float8_e4m3fn one,
the latter with the per-tensor KVScales given to select_backend (graphllm/ops/kv_quant.py).
FlashInfer is refused with an fp8 cache: its fp8 prefill kernel failed to build on the H200.
"""

import contextlib
import importlib.util
import os
from typing import Iterator

import torch

from graphllm.models.config import ModelConfig
from graphllm.ops.backends.base import AttentionBackend, HostMeta, TorchBackend
from graphllm.ops.kv_quant import KVScales, is_fp8

__all__ = ["AttentionBackend", "HostMeta", "TorchBackend", "active_backend", "select_backend", "use_backend"]

_REFERENCE = TorchBackend()
_active: AttentionBackend | None = None


def active_backend() -> AttentionBackend:
    return _active or _REFERENCE


@contextlib.contextmanager
def use_backend(backend: AttentionBackend) -> Iterator[AttentionBackend]:
    """Make `backend` run the attention op for the steps inside the block; restores on exit."""
    global _active
    saved, _active = _active, backend
    try:
        yield backend
    finally:
        _active = saved


def flashinfer_supports(config: ModelConfig, dtype: torch.dtype, kv_cache_dtype: torch.dtype | None = None) -> str | None:
    """None when FlashInfer can run this model, else why not."""
    if is_fp8(kv_cache_dtype):
        return ("FlashInfer 0.6's prefill kernel for a float8_e4m3fn KV cache failed to build on the H200 "
                "(sm_90, 2026-11-21); use the triton backend or kv_cache_dtype 'auto'")
    if dtype not in (torch.float16, torch.bfloat16):
        return f"FlashInfer kernels take float16/bfloat16, not {dtype}"
    if config.head_dim not in (64, 128, 256):
        return f"FlashInfer has no kernels for head_dim {config.head_dim}"
    if importlib.util.find_spec("flashinfer") is None:
        return "flashinfer is not installed (pip install flashinfer-python)"
    return None


def triton_supports(device: torch.device, kv_cache_dtype: torch.dtype | None = None) -> str | None:
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed"
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return f"the Triton kernels need a CUDA device (or TRITON_INTERPRET=1), not {device.type}"
    if is_fp8(kv_cache_dtype) and device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        return "Triton's float8_e4m3fn (an fp8 KV cache) needs compute capability 8.9 or newer"
    return None


def select_backend(name: str, config: ModelConfig, dtype: torch.dtype, device: torch.device,
                   block_size: int, kv_cache_dtype: torch.dtype | None = None,
                   kv_scales: KVScales = KVScales()) -> AttentionBackend:
    """`name` from EngineConfig.attention_backend. auto: triton on CUDA, else flashinfer, else torch.

    Triton comes first because it measured faster than FlashInfer 0.6's decode wrapper (CUDA
    cores) on the H200 at every batch size tried (benchmarks/RESULTS.md, 2026-11-21).
    kv_cache_dtype: the cache's element type (None: the model's dtype); kv_scales: a float8
    cache's per-tensor scales.
    """
    if name == "auto":
        if device.type != "cuda":
            name = "torch"
        elif triton_supports(device, kv_cache_dtype) is None:
            name = "triton"
        else:
            name = "flashinfer" if flashinfer_supports(config, dtype, kv_cache_dtype) is None else "torch"
    if name == "torch":
        return TorchBackend(kv_scales)
    if name == "triton":
        if (why := triton_supports(device, kv_cache_dtype)) is not None:
            raise ValueError(f"attention backend 'triton' is unavailable: {why}")
        from graphllm.ops.backends.triton_backend import TritonBackend
        return TritonBackend(kv_scales)
    if name == "flashinfer":
        why = ("it needs a CUDA device" if device.type != "cuda" and not is_fp8(kv_cache_dtype)
               else flashinfer_supports(config, dtype, kv_cache_dtype))
        if why is not None:
            raise ValueError(f"attention backend 'flashinfer' is unavailable: {why}")
        from graphllm.ops.backends.flashinfer_backend import FlashInferBackend
        return FlashInferBackend(config, dtype, device, block_size)  # fp8 caches are refused above
    raise ValueError(f"unknown attention backend {name!r}")
