"""Attention backends: who runs `torch.ops.graphllm.attention` at run time.

The op is one opaque node in every graph (eager, AOTInductor, Inductor), so the same compiled
artifact runs with any backend. The runtime picks one (`select_backend`), plans it on the host
before each step or CUDA-graph replay (`plan`), and makes it active for the step with the op's
scope (graphllm.ops.attention.use_backend).

  torch       the reference of graphllm/kernels/reference.py: float32 over gathered pages (CPU, oracle)
  triton      graphllm/kernels: store_kv + split-KV paged decode / paged prefill (no host planning); for
              DeepSeek-V2's latent cache, mla_decode / mla_prefill (graphllm.mla_attention)
  flashinfer  FlashInfer's paged decode and prefill wrappers, planned on the host; CUDA-graph
              decode uses one fixed-buffer wrapper per batch bucket

The torch and triton backends write and read a cache of the model's dtype or a float8_e4m3fn one,
the latter with per-tensor KVScales per layer (graphllm/kernels/kv_quant.py; AttentionBackend.scales_for).
FlashInfer is refused with an fp8 cache: its fp8 prefill kernel failed to build on the H200.

This room sits between the kernels (below) and the ops (above): it imports kernels/ only.
"""

from graphllm.backends.base import AttentionBackend, AttentionShape, HostMeta
from graphllm.backends.selection import flashinfer_supports, select_backend, triton_supports, xqa_supports
from graphllm.backends.torch_backend import TorchBackend

__all__ = ["AttentionBackend", "AttentionShape", "HostMeta", "TorchBackend", "flashinfer_supports",
           "select_backend", "triton_supports", "xqa_supports"]
