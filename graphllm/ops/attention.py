"""Paged attention with the KV-cache write, as one registered custom op.

`torch.ops.graphllm.attention` is the only place where a model touches batching or the KV
cache. Tracing (torch.compile, torch.export) sees it as one opaque node thanks to the fake
implementation below; the runtime chooses the backend (graphllm/backends: torch, triton,
flashinfer) and scopes it around the step with `use_backend` below: the op runs the backend of
the innermost scope of its thread or task (a ContextVar, restored on exit, also on error), and
outside every scope it raises instead of falling back to a default, so a step that forgot its
scope fails loudly. Whoever runs a model directly (a test, a pass check) scopes the backend it
wants, usually `use_backend(TorchBackend())`. The PyTorch reference over the pages, what the CPU runs and the oracle of
the GPU kernels, is graphllm/kernels/reference.py.

Step metadata is flat tensors (see DESIGN.md, "Step inputs are flat tensors"):
  slot_mapping[T]       cache slot (block * block_size + offset) of each new token
  block_tables[B, M]    block ids of each sequence (padded with 0 past its last block)
  seq_lens[B]           tokens in cache after this step, per sequence
  query_start_loc[B+1]  token offsets of each sequence's new tokens in the flat batch
  kv_caches[L]          one [2, num_blocks, block_size, Hkv, D] tensor per layer, written in place
The token positions come from the model (`positions[T]`); token t may attend to cached
tokens 0..positions[t] of its own sequence.

The cache's element type is the model's dtype, or float8_e4m3fn (EngineConfig.kv_cache_dtype
"fp8"): then K and V are stored as saturate(x / scale) and read as stored * scale, with the
per-tensor KVScales of each layer the runtime binds in the backend (graphllm/kernels/kv_quant.py). Neither the scales
nor the element type are in the op's signature, so one compiled graph serves every cache dtype.
"""

import contextlib
from contextvars import ContextVar
from typing import Iterator, NamedTuple

import torch

from graphllm.backends import AttentionBackend
from graphllm.kernels.rotary import HeadNorms


_active: ContextVar[AttentionBackend | None] = ContextVar("graphllm_attention_backend", default=None)


def active_backend() -> AttentionBackend:
    backend = _active.get()
    if backend is None:
        raise RuntimeError("the attention op ran outside an attention backend's scope: run the model inside "
                           "`with graphllm.ops.attention.use_backend(backend):` (TorchBackend() is the reference)")
    return backend


@contextlib.contextmanager
def use_backend(backend: AttentionBackend) -> Iterator[AttentionBackend]:
    """Make `backend` run the attention op for the steps inside the block; restores on exit."""
    token = _active.set(backend)
    try:
        yield backend
    finally:
        _active.reset(token)


class AttentionMetadata(NamedTuple):
    """The flat per-step tensors that the attention op reads (shapes in the module docstring)."""

    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    kv_caches: list[torch.Tensor]


@torch.library.custom_op("graphllm::attention", mutates_args=("kv_cache",))
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
              positions: torch.Tensor, slot_mapping: torch.Tensor, block_tables: torch.Tensor,
              seq_lens: torch.Tensor, query_start_loc: torch.Tensor, scale: float,
              sliding_window: int, logit_softcap: float = 0.0) -> torch.Tensor:
    """Write k/v ([T, Hkv, D]) into kv_cache at slot_mapping, then attend q ([T, Hq, D]).

    Returns [T, Hq, D] in q's dtype. sliding_window <= 0 means full attention; otherwise token
    at position p sees keys at positions p - sliding_window + 1 .. p (Mistral's convention).
    logit_softcap > 0: the scaled scores s become logit_softcap * tanh(s / logit_softcap) before
    the mask (Gemma 2's attention-logit soft-capping); 0 = off.
    """
    return active_backend().forward(q, k, v, kv_cache, positions, slot_mapping, block_tables, seq_lens,
                                    query_start_loc, scale, sliding_window, logit_softcap)


@attention.register_fake
def _(q, k, v, kv_cache, positions, slot_mapping, block_tables, seq_lens, query_start_loc,
      scale, sliding_window, logit_softcap=0.0):
    return torch.empty_like(q)


@torch.library.custom_op("graphllm::rope_attention", mutates_args=("kv_cache",))
def rope_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   kv_cache: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor,
                   block_tables: torch.Tensor, seq_lens: torch.Tensor, query_start_loc: torch.Tensor,
                   scale: float, sliding_window: int, logit_softcap: float = 0.0,
                   q_norm: torch.Tensor | None = None, k_norm: torch.Tensor | None = None, norm_eps: float = 0.0,
                   norm_unit_offset: bool = False) -> torch.Tensor:
    """attention(apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v, ...), cos and sin [T, D]; with q_norm
    and k_norm ([D]) q and k are first RMS-normed per head (rms_norm(x, q_norm, norm_eps, norm_unit_offset)).

    What the fuse_rope_attention pass puts in place of a layer's (head norms,) rotary embedding and attention
    op, so that a backend can norm and rotate q and k inside its KV-cache write (one kernel instead of
    three or five). Returns [T, Hq, D], contiguous, in q's dtype.
    """
    norms = None if q_norm is None else HeadNorms(q_norm, k_norm, norm_eps, norm_unit_offset)
    return active_backend().rope_forward(q, k, v, cos, sin, kv_cache, positions, slot_mapping, block_tables,
                                         seq_lens, query_start_loc, scale, sliding_window, logit_softcap, norms)


@rope_attention.register_fake
def _(q, k, v, cos, sin, kv_cache, positions, slot_mapping, block_tables, seq_lens, query_start_loc,
      scale, sliding_window, logit_softcap=0.0, q_norm=None, k_norm=None, norm_eps=0.0, norm_unit_offset=False):
    return q.new_empty(q.shape)
