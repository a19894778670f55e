"""Attention with graphllm's own Triton kernels (graphllm/kernels): one store_kv launch (or, for
graphllm.rope_attention, one rope_store_kv launch that also rotates q and k), then split-KV paged
decode when every sequence has one new token, else paged prefill.

A mixed step (decodes and prompt chunks in one batch, never CUDA-graphed) runs its leading
one-token sequences (the scheduler puts running sequences first) through the decode kernel and
the rest through the prefill kernel: the prefill kernel's one-token path ran those rows 25%
slower (kernel_sweep mixed, H200: 256 rows of 850 tokens at 3.20 against 3.99 TB/s). `plan`
counts them from the host metadata it is given before every step; nothing else is planned on
the host, and launch grids depend on tensor shapes only, so a decode step captures into a CUDA
graph as is. A float8 cache is written and read with `kv_scales`."""

import numpy as np

from graphllm.kernels.paged_decode_attention import paged_decode_attention
from graphllm.kernels.paged_prefill_attention import paged_prefill_attention
from graphllm.kernels.rope_store_kv import rope_store_kv
from graphllm.kernels.store_kv import store_kv
from graphllm.ops.backends.base import AttentionBackend, HostMeta


class TritonBackend(AttentionBackend):
    name = "triton"
    # (tokens, sequences, leading one-token sequences) of the planned mixed step, or None
    _mixed: tuple[int, int, int] | None = None

    def plan(self, host: HostMeta, graph_bucket: int | None = None) -> None:
        self._mixed = None
        if graph_bucket is None and not host.is_decode:
            new_tokens = np.diff(host.query_start_loc)
            leading = int(np.argmax(new_tokens != 1))  # the first sequence with more than one new token
            if leading > 0:
                self._mixed = (int(host.query_start_loc[-1]), len(new_tokens), leading)

    def forward(self, q, k, v, kv_cache, positions, slot_mapping, block_tables, seq_lens, query_start_loc,
                scale, sliding_window):
        store_kv(k, v, kv_cache, slot_mapping, self.kv_scales)
        return self._attend(q, kv_cache, block_tables, seq_lens, query_start_loc, scale, sliding_window)

    def rope_forward(self, q, k, v, cos, sin, kv_cache, positions, slot_mapping, block_tables, seq_lens,
                     query_start_loc, scale, sliding_window):
        q = rope_store_kv(q, k, v, cos, sin, kv_cache, slot_mapping, self.kv_scales)
        return self._attend(q, kv_cache, block_tables, seq_lens, query_start_loc, scale, sliding_window)

    def _attend(self, q, kv_cache, block_tables, seq_lens, query_start_loc, scale, sliding_window):
        k_cache, v_cache = kv_cache[0], kv_cache[1]
        if q.shape[0] == seq_lens.shape[0]:  # T == B: decode
            return paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale, sliding_window,
                                          kv_scales=self.kv_scales)
        if self._mixed is None or self._mixed[:2] != (q.shape[0], seq_lens.shape[0]):
            return paged_prefill_attention(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc,
                                           scale, sliding_window, kv_scales=self.kv_scales)
        n = self._mixed[2]  # rows 0..n-1 are sequences 0..n-1, one token each
        out = q.new_empty(q.shape)
        out[:n] = paged_decode_attention(q[:n], k_cache, v_cache, block_tables[:n], seq_lens[:n], scale,
                                         sliding_window, kv_scales=self.kv_scales)
        out[n:] = paged_prefill_attention(q[n:], k_cache, v_cache, block_tables[n:], seq_lens[n:],
                                          query_start_loc[n:] - n, scale, sliding_window, kv_scales=self.kv_scales)
        return out
