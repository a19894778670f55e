"""Attention with FlashInfer's paged wrappers, planned on the host outside the captured graphs.

One float workspace serves every wrapper (they never run concurrently):
  prefill   BatchPrefillWithPagedKVCacheWrapper, causal: prefill, chunked prefill, mixed steps
  decode    BatchDecodeWithPagedKVCacheWrapper: decode steps run outside CUDA graphs
  graphs    one decode wrapper per CUDA-graph bucket, with fixed index buffers (FlashInfer's
            CUDA-graph mode): `plan` before capture and before every replay rewrites them

The KV write is graphllm's Triton store_kv (one launch for K and V), or rope_store_kv for
graphllm.rope_attention (the rotary of q and k in the same launch). The cache is NHD:
kv_cache[0] / kv_cache[1] are [num_blocks, block_size, Hkv, D] pages, which FlashInfer reads as is.

Every wrapper is planned for the one attention of the AttentionShape: its scale, window and logit soft
cap (FlashInfer's logits_soft_cap, Gemma 2's cap * tanh(s / cap)). A layer that asks for another (Gemma's
alternating sliding-window and global layers) is refused at its first step, not run with the plan's.
"""

import numpy as np
import torch

from graphllm.kernels.rope_store_kv import rope_store_kv
from graphllm.kernels.rotary import normed_heads
from graphllm.kernels.store_kv import store_kv
from graphllm.backends.base import AttentionBackend, AttentionShape, HostMeta

WORKSPACE_BYTES = 256 * 2**20


class FlashInferBackend(AttentionBackend):
    name = "flashinfer"
    plans_on_host = True

    def __init__(self, shape: AttentionShape, dtype: torch.dtype, device: torch.device, block_size: int):
        super().__init__()  # model-dtype caches only (fp8 is refused at selection): the default scales
        import flashinfer
        self.flashinfer = flashinfer
        self.heads = (shape.num_heads, shape.num_kv_heads, shape.head_dim)
        self.block_size, self.dtype, self.device = block_size, dtype, device
        self.scale = shape.scale or shape.head_dim ** -0.5  # PagedAttention's scale: checked in forward
        self.window_left = shape.sliding_window - 1 if shape.sliding_window > 0 else -1
        self.logit_softcap = max(shape.logit_softcap, 0.0)
        self.workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self.prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD")
        self.decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(self.workspace, "NHD")
        self.graph_decoders: dict[int, object] = {}
        self.active = None  # the wrapper planned for the next step

    def plan(self, host: HostMeta, graph_bucket: int | None = None) -> None:
        indptr, indices, last_page_len = host.paged_kv(self.block_size)
        common = dict(window_left=self.window_left, sm_scale=self.scale, q_data_type=self.dtype,
                      kv_data_type=self.dtype, logits_soft_cap=self.logit_softcap or None)  # None: no cap
        if graph_bucket is not None or host.is_decode:
            wrapper = self.decode if graph_bucket is None else self.graph_decoder(graph_bucket, host)
            wrapper.plan(indptr, indices, last_page_len, *self.heads, self.block_size, **common)
        else:
            wrapper = self.prefill
            wrapper.plan(torch.from_numpy(host.query_start_loc.astype(np.int32)), indptr, indices, last_page_len, *self.heads,
                         self.block_size, causal=True, **common)
        self.active = wrapper

    def graph_decoder(self, bucket: int, host: HostMeta):
        """The fixed-buffer decode wrapper of a CUDA-graph bucket (sized from the graph's block table)."""
        if bucket not in self.graph_decoders:
            i32 = dict(dtype=torch.int32, device=self.device)
            max_pages = bucket * host.block_tables.shape[1]
            self.graph_decoders[bucket] = self.flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                self.workspace, "NHD", use_cuda_graph=True,
                paged_kv_indptr_buffer=torch.zeros(bucket + 1, **i32),
                paged_kv_indices_buffer=torch.zeros(max_pages, **i32),
                paged_kv_last_page_len_buffer=torch.zeros(bucket, **i32))
        return self.graph_decoders[bucket]

    def forward(self, q, k, v, kv_cache, positions, slot_mapping, block_tables, seq_lens, query_start_loc,
                scale, sliding_window, logit_softcap=0.0):
        self._check(scale, sliding_window, logit_softcap)
        store_kv(k, v, kv_cache, slot_mapping)
        return self.active.run(q.contiguous(), (kv_cache[0], kv_cache[1]))

    def rope_forward(self, q, k, v, cos, sin, kv_cache, positions, slot_mapping, block_tables, seq_lens,
                     query_start_loc, scale, sliding_window, logit_softcap=0.0, norms=None):
        self._check(scale, sliding_window, logit_softcap)
        q, k = normed_heads(q, k, norms)
        q = rope_store_kv(q, k, v, cos, sin, kv_cache, slot_mapping)
        return self.active.run(q, (kv_cache[0], kv_cache[1]))

    def _check(self, scale: float, sliding_window: int, logit_softcap: float) -> None:
        if self.active is None:
            raise RuntimeError("FlashInfer attention ran without a plan: call plan() before the step")
        planned = (self.scale, self.window_left + 1, self.logit_softcap)
        if planned != (scale, max(sliding_window, 0), max(logit_softcap, 0.0)):
            raise ValueError(f"FlashInfer was planned for (scale, window, logit soft cap) {planned}, the model's layer "
                             f"asks {(scale, sliding_window, logit_softcap)}: one plan serves one attention; use the "
                             "triton or torch backend")
