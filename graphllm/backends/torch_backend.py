"""The PyTorch reference backend: float32 attention over gathered pages (graphllm/kernels/reference.py).

What the CPU runs, and the oracle of the triton and flashinfer backends. A float8 cache is written
and read with the backend's KVScales."""

from graphllm.backends.base import AttentionBackend
from graphllm.kernels.mla_reference import reference_mla_attention, write_latent_cache
from graphllm.kernels.reference import reference_attention, write_kv_cache


class TorchBackend(AttentionBackend):
    """The PyTorch reference (float32 over gathered pages): CPU, and the oracle of the others."""

    name = "torch"

    def forward(self, q, k, v, kv_cache, positions, slot_mapping, block_tables, seq_lens, query_start_loc,
                scale, sliding_window, logit_softcap=0.0):
        write_kv_cache(k, v, kv_cache, slot_mapping, self.scales_for(kv_cache))
        out = reference_attention(q, kv_cache, positions, block_tables, query_start_loc, scale, sliding_window,
                                  self.scales_for(kv_cache), logit_softcap)
        return out.to(q.dtype)

    def mla_forward(self, q, kv, kv_cache, positions, slot_mapping, block_tables, seq_lens, query_start_loc,
                    scale, kv_lora_rank):
        write_latent_cache(kv, kv_cache, slot_mapping)
        out = reference_mla_attention(q, kv_cache, positions, block_tables, query_start_loc, scale, kv_lora_rank)
        return out.to(q.dtype)
