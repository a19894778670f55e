"""Attention with graphllm's own Triton kernels (graphllm/kernels): one store_kv launch (or, for
graphllm.rope_attention, one rope_store_kv launch that also rotates q and k), then split-KV paged
decode when every sequence has one new token, else paged prefill. Multi-head latent attention (DeepSeek-V2's
graphllm.mla_attention) writes its latent entries with index_copy_, then runs kernels/mla_decode.py or
kernels/mla_prefill.py on the same rule (interpreter-tested; not yet run on a GPU).

Nothing is planned on the host: launch grids depend on tensor shapes only, so a decode step
captures into a CUDA graph as is. A float8 cache is written and read with `kv_scales`."""

from graphllm.kernels.mla_decode import mla_decode_attention
from graphllm.kernels.mla_prefill import mla_prefill_attention
from graphllm.kernels.mla_reference import write_latent_cache
from graphllm.kernels.paged_decode_attention import paged_decode_attention
from graphllm.kernels.paged_prefill_attention import paged_prefill_attention
from graphllm.kernels.rope_store_kv import rope_store_kv
from graphllm.kernels.store_kv import store_kv
from graphllm.backends.base import AttentionBackend


class TritonBackend(AttentionBackend):
    name = "triton"

    def forward(self, q, k, v, kv_cache, positions, slot_mapping, block_tables, seq_lens, query_start_loc,
                scale, sliding_window, logit_softcap=0.0):
        store_kv(k, v, kv_cache, slot_mapping, self.scales_for(kv_cache))
        return self._attend(q, kv_cache, block_tables, seq_lens, query_start_loc, scale, sliding_window,
                            logit_softcap)

    def rope_forward(self, q, k, v, cos, sin, kv_cache, positions, slot_mapping, block_tables, seq_lens,
                     query_start_loc, scale, sliding_window, logit_softcap=0.0):
        q = rope_store_kv(q, k, v, cos, sin, kv_cache, slot_mapping, self.scales_for(kv_cache))
        return self._attend(q, kv_cache, block_tables, seq_lens, query_start_loc, scale, sliding_window,
                            logit_softcap)

    def mla_forward(self, q, kv, kv_cache, positions, slot_mapping, block_tables, seq_lens, query_start_loc,
                    scale, kv_lora_rank):
        write_latent_cache(kv, kv_cache, slot_mapping)  # index_copy_: no host sync, CUDA-graph safe
        cache = kv_cache[0, :, :, 0]  # [blocks, block_size, C]
        if q.shape[0] == seq_lens.shape[0]:  # T == B: decode
            return mla_decode_attention(q, cache, block_tables, seq_lens, scale, kv_lora_rank)
        return mla_prefill_attention(q, cache, block_tables, seq_lens, query_start_loc, scale, kv_lora_rank)

    def _attend(self, q, kv_cache, block_tables, seq_lens, query_start_loc, scale, sliding_window, logit_softcap):
        if q.shape[0] == seq_lens.shape[0]:  # T == B: decode
            return paged_decode_attention(q, kv_cache[0], kv_cache[1], block_tables, seq_lens, scale,
                                          sliding_window, kv_scales=self.scales_for(kv_cache),
                                          logit_softcap=logit_softcap)
        return paged_prefill_attention(q, kv_cache[0], kv_cache[1], block_tables, seq_lens, query_start_loc,
                                       scale, sliding_window, kv_scales=self.scales_for(kv_cache),
                                       logit_softcap=logit_softcap)
