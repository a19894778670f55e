"""Which attention backend runs a model: `select_backend` from EngineConfig.attention_backend's name.

auto picks triton on CUDA (measured faster than FlashInfer 0.6's decode wrapper on the H200 at
every batch size tried, benchmarks/RESULTS.md, 2026-11-21), else flashinfer, else the torch
reference; on CPU always the reference. Asking for a backend that cannot run names the reason.
"""

import importlib.util

import torch

from graphllm.backends.base import AttentionBackend, AttentionShape
from graphllm.backends.torch_backend import TorchBackend
from graphllm.kernels.kv_quant import FP8_QK_HEAD_DIM, KVScales, is_fp8


def flashinfer_supports(shape: AttentionShape, dtype: torch.dtype,
                        kv_cache_dtype: torch.dtype | None = None) -> str | None:
    """None when FlashInfer can run this attention, else why not."""
    if is_fp8(kv_cache_dtype):
        return ("FlashInfer 0.6's prefill kernel for a float8_e4m3fn KV cache failed to build on the H200 "
                "(sm_90, 2026-11-21); use the triton backend or kv_cache_dtype 'auto'")
    if dtype not in (torch.float16, torch.bfloat16):
        return f"FlashInfer kernels take float16/bfloat16, not {dtype}"
    if shape.head_dim not in (64, 128, 256):
        return f"FlashInfer has no kernels for head_dim {shape.head_dim}"
    if not shape.uniform:
        return ("graphllm plans FlashInfer once for every layer, and this model's layers differ in sliding window, "
                "scale or logit soft cap (Gemma); use the triton or torch backend")
    if importlib.util.find_spec("flashinfer") is None:
        return "flashinfer is not installed (pip install flashinfer-python)"
    return None


def xqa_supports(backend: str, shape: AttentionShape, device: torch.device, kv_cache_dtype: torch.dtype) -> str | None:
    """None when the triton backend's decode can run through flashinfer.xqa (EngineConfig.xqa_decode), else why
    not: it takes the float8 cache's launches where graphllm's kernel would round q to float8
    (TritonBackend._runs_xqa), so a cache or heads where that never happens are refused rather than ignored.
    Layers with a soft cap or a sliding window keep graphllm's kernel."""
    if backend != "triton":
        return f"it replaces the triton backend's decode kernel, and the attention backend is {backend!r}"
    if shape.mla:
        return "multi-head latent attention (MLA) has its own decode kernel"
    if not is_fp8(kv_cache_dtype):
        return (f"it takes float8 caches' decode only (over a {kv_cache_dtype} cache it measured slower than "
                "graphllm's kernel): add --kv-cache-dtype fp8")
    if shape.head_dim != FP8_QK_HEAD_DIM:
        return f"it takes {FP8_QK_HEAD_DIM}-wide heads only (where graphllm's kernel rounds q), not {shape.head_dim}"
    if device.type != "cuda" or torch.cuda.get_device_capability(device) < (9, 0):
        return "TensorRT-LLM's XQA kernel (flashinfer.xqa) needs a GPU of compute capability 9.0 or newer"
    if importlib.util.find_spec("flashinfer") is None:
        return "flashinfer is not installed (pip install flashinfer-python)"
    return None


def _triton_interprets() -> bool:
    """Triton's own interpreter switch (its TRITON_INTERPRET knob), which runs kernels on CPU tensors."""
    import triton
    knobs = getattr(triton, "knobs", None)
    return bool(knobs is not None and knobs.runtime.interpret)


def triton_supports(device: torch.device, kv_cache_dtype: torch.dtype | None = None) -> str | None:
    """None when graphllm's Triton kernels can run on `device`, else why not."""
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed"
    if device.type != "cuda" and not _triton_interprets():
        return f"the Triton kernels need a CUDA device (or Triton's interpreter, TRITON_INTERPRET=1), not {device.type}"
    if is_fp8(kv_cache_dtype) and device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        return "Triton's float8_e4m3fn (an fp8 KV cache) needs compute capability 8.9 or newer"
    return None


def mla_backend(name: str, device: torch.device, kv_cache_dtype: torch.dtype | None,
                kv_scales: KVScales) -> AttentionBackend:
    """Multi-head latent attention (DeepSeek-V2) runs on the torch reference or graphllm's Triton MLA kernels
    (kernels/mla_decode.py, kernels/mla_prefill.py: interpreter-tested, not yet run on a GPU). auto picks triton
    on CUDA when triton_supports it, else the reference. FlashInfer has no MLA here, and no backend reads a
    float8 latent cache: both refused by name."""
    if is_fp8(kv_cache_dtype):
        raise ValueError("a float8 KV cache is not supported for multi-head latent attention (MLA, DeepSeek-V2) "
                         "yet; use kv_cache_dtype 'auto'")
    if name == "auto":
        name = "triton" if device.type == "cuda" and triton_supports(device) is None else "torch"
    if name == "torch":
        return TorchBackend(kv_scales)
    if name == "triton":
        if (why := triton_supports(device)) is not None:
            raise ValueError(f"attention backend 'triton' is unavailable: {why}")
        from graphllm.backends.triton_backend import TritonBackend
        return TritonBackend(kv_scales)
    if name == "flashinfer":
        raise ValueError("attention backend 'flashinfer' does not run multi-head latent attention (MLA, DeepSeek-V2) "
                         "yet; use attention_backend 'triton' or 'torch' (or 'auto')")
    raise ValueError(f"unknown attention backend {name!r}")


def select_backend(name: str, shape: AttentionShape, dtype: torch.dtype, device: torch.device,
                   block_size: int, kv_cache_dtype: torch.dtype | None = None,
                   kv_scales: KVScales = KVScales()) -> AttentionBackend:
    """The backend `name` (auto: see the module docstring) for attention of `shape` in `dtype`.

    kv_cache_dtype: the cache's element type (None: the model's dtype); kv_scales: a float8
    cache's per-tensor scales.
    """
    if shape.mla:
        return mla_backend(name, device, kv_cache_dtype, kv_scales)
    if name == "auto":
        if device.type != "cuda":
            name = "torch"
        elif triton_supports(device, kv_cache_dtype) is None:
            name = "triton"
        else:
            name = "flashinfer" if flashinfer_supports(shape, dtype, kv_cache_dtype) is None else "torch"
    if name == "torch":
        return TorchBackend(kv_scales)
    if name == "triton":
        if (why := triton_supports(device, kv_cache_dtype)) is not None:
            raise ValueError(f"attention backend 'triton' is unavailable: {why}")
        from graphllm.backends.triton_backend import TritonBackend
        return TritonBackend(kv_scales)
    if name == "flashinfer":
        why = ("it needs a CUDA device" if device.type != "cuda" and not is_fp8(kv_cache_dtype)
               else flashinfer_supports(shape, dtype, kv_cache_dtype))
        if why is not None:
            raise ValueError(f"attention backend 'flashinfer' is unavailable: {why}")
        from graphllm.backends.flashinfer_backend import FlashInferBackend
        return FlashInferBackend(shape, dtype, device, block_size)  # fp8 caches are refused above
    raise ValueError(f"unknown attention backend {name!r}")
