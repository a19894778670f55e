"""Attention with graphllm's own Triton kernels (graphllm/kernels): one store_kv launch (or, for
graphllm.rope_attention, one rope_store_kv launch that also rotates q and k; at decode, unless
fuse_rope_decode is off, the split kernel does that itself, kernels/rope_decode.py), then split-KV paged decode
when every sequence has one new token, split-KV paged verify attention when none has more than
paged_verify_attention.MAX_TOKENS (speculative decoding's verify steps: the host's plan of the step says
so; switched off for now: TritonBackend.verify_kernel), else paged prefill. Multi-head latent attention (DeepSeek-V2's
graphllm.mla_attention) writes its latent entries with index_copy_, then runs kernels/mla_decode.py or
kernels/mla_prefill.py on the same rule (interpreter-tested; not yet run on a GPU).

Nothing is planned on the host but that bound (`plan` reads the step's query lengths, which the host
has): launch grids depend on tensor shapes only, so decode and verify steps capture into CUDA graphs as
they are. A float8 cache is written and read with `kv_scales`."""

import numpy as np

from graphllm.kernels.mla_decode import mla_decode_attention
from graphllm.kernels.mla_prefill import mla_prefill_attention
from graphllm.kernels.mla_reference import write_latent_cache
from graphllm.kernels.paged_decode_attention import paged_decode_attention
from graphllm.kernels.paged_prefill_attention import paged_prefill_attention
from graphllm.kernels.paged_verify_attention import MAX_TOKENS, paged_verify_attention
from graphllm.kernels.rope_decode import NewTokens
from graphllm.kernels.rope_store_kv import rope_store_kv
from graphllm.kernels.rotary import normed_heads
from graphllm.kernels.store_kv import store_kv
from graphllm.backends.base import AttentionBackend


class TritonBackend(AttentionBackend):
    name = "triton"
    # (tokens, sequences, the most new tokens a sequence) of the step planned last; a step of other shapes
    # was not planned (a direct call of the step) and takes the prefill kernel
    planned: tuple[int, int, int] = (0, 0, 0)
    # paged_verify_attention for steps of 2..MAX_TOKENS new tokens a sequence. Off: on the H200 (fifteenth
    # session) three calls whose first stage was `bench spec` on the 8B preset, with the kernel replayed
    # from verify CUDA graphs, lost the machine (it stopped answering ~200 s in), while `bench latency`
    # ran; the kernel passes its GPU tests called directly and in an engine without CUDA graphs. Until
    # the engine path under graphs is proven, those steps take the prefill kernel (benchmarks/RESULTS.md).
    verify_kernel: bool = False
    # graphllm.rope_attention at decode: the split kernel rotates q and k and stores the new token itself
    # (kernels/rope_decode.py), one launch a layer fewer than rope_store_kv then the split kernel; on:
    # EngineConfig.fuse_rope_decode (on by default; --no-fuse-rope-decode: rope_store_kv, then the split kernel)
    fuse_rope_decode: bool = True

    @property
    def mixed_step_graphs(self) -> bool:
        """Prefill and mixed steps capture: store_kv / rope_store_kv, then the prefill kernel (and, from
        DECODE_KERNEL_MIN_SEQS sequences, the decode kernel's mixed launch), whose grids are shapes alone. Not
        with the verify kernel on: its choice follows the host's plan, which a captured graph would freeze."""
        return not self.verify_kernel

    def plan(self, host, graph_bucket=None) -> None:
        counts = np.diff(host.query_start_loc)
        self.planned = (int(host.query_start_loc[-1]), len(host.seq_lens), int(counts.max()) if len(counts) else 0)

    def _max_new_tokens(self, q, seq_lens) -> int | None:
        """The planned bound on new tokens a sequence, when this step is the one planned."""
        tokens, seqs, most = self.planned
        return most if (tokens, seqs) == (q.shape[0], seq_lens.shape[0]) else None

    def forward(self, q, k, v, kv_cache, positions, slot_mapping, block_tables, seq_lens, query_start_loc,
                scale, sliding_window, logit_softcap=0.0):
        store_kv(k, v, kv_cache, slot_mapping, self.scales_for(kv_cache))
        return self._attend(q, kv_cache, block_tables, seq_lens, query_start_loc, scale, sliding_window,
                            logit_softcap)

    def rope_forward(self, q, k, v, cos, sin, kv_cache, positions, slot_mapping, block_tables, seq_lens,
                     query_start_loc, scale, sliding_window, logit_softcap=0.0, norms=None):
        if self.fuse_rope_decode and q.shape[0] == seq_lens.shape[0]:  # T == B: decode
            return paged_decode_attention(q, kv_cache[0], kv_cache[1], block_tables, seq_lens, scale,
                                          sliding_window, kv_scales=self.scales_for(kv_cache),
                                          logit_softcap=logit_softcap,
                                          new_tokens=NewTokens(k, v, cos, sin, slot_mapping, norms))
        q, k = normed_heads(q, k, norms)
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
        most = self._max_new_tokens(q, seq_lens)
        if self.verify_kernel and most is not None and 1 < most <= MAX_TOKENS:
            return paged_verify_attention(q, kv_cache[0], kv_cache[1], block_tables, seq_lens, query_start_loc,
                                          scale, sliding_window, most, kv_scales=self.scales_for(kv_cache),
                                          logit_softcap=logit_softcap)
        return paged_prefill_attention(q, kv_cache[0], kv_cache[1], block_tables, seq_lens, query_start_loc,
                                       scale, sliding_window, kv_scales=self.scales_for(kv_cache),
                                       logit_softcap=logit_softcap)
