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
they are. A float8 cache is written and read with `kv_scales`.

With `xqa_decode` (EngineConfig.xqa_decode: by default wherever sm_90+, a float8 cache, 128-wide heads and an
installed flashinfer whose XQA builds allow it; probe_xqa), the decode launches
where the split kernel would round q to float8 (paged_decode_attention.rounds_q_to_fp8: 128-wide heads, from
FP8_HALVES_PROGRAMS (sequence, KV head) programs) instead run rope_store_kv and then TensorRT-LLM's XQA decode
kernel as FlashInfer builds it (flashinfer.xqa), its Hopper kernel (TMA loads, float8 MMAs, q rounded to float8 as
well): it reads the padded block table and the lengths on the device, so it captures as the split kernel does.
Measured (s36, H100, benchmarks/RESULTS.md): 11-23% faster than the split kernel over float8 caches at 128-512
sequences (+3.75% fp8 throughput at 256 sequences, +8.6% at 512: s36-s37); slower over bf16 caches; and at fewer
programs it would round q where the split kernel keeps bf16, which cost 3.8 points of teacher-forced agreement. Where
both round q it still costs ~2.4 points (s37): its Hopper kernel also rounds P to float8 for the P.V MMA
(mha_sm90.cu, CACHE_ELEM_ENUM 2), as FlashAttention-3's float8 path that vLLM runs over a float8 cache does.
Layers with a logit soft cap or a sliding window keep the split kernel."""

import math

import numpy as np
import torch

from graphllm.kernels.mla_decode import mla_decode_attention
from graphllm.kernels.mla_prefill import mla_prefill_attention
from graphllm.kernels.mla_reference import write_latent_cache
from graphllm.kernels.kv_quant import is_fp8
from graphllm.kernels.paged_decode_attention import paged_decode_attention, rounds_q_to_fp8
from graphllm.kernels.paged_prefill_attention import DECODE_KERNEL_MIN_SEQS, paged_prefill_attention
from graphllm.kernels.paged_verify_attention import MAX_TOKENS, paged_verify_attention
from graphllm.kernels.rope_decode import NewTokens
from graphllm.kernels.rope_store_kv import rope_store_kv
from graphllm.kernels.rotary import normed_heads
from graphllm.kernels.store_kv import store_kv
from graphllm.backends.base import AttentionBackend

XQA_MAX_SEQ_HEADS = 8192 * 8  # sequences x KV heads a decode step through XQA may have (its semaphores)
XQA_SCRATCH_BYTES = 256 * 2**20  # XQA's workspace, as FlashInfer's tests give it (the KV cache's budget leaves it)


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
    # float8 caches' large decode launches through TensorRT-LLM's XQA kernel (flashinfer.xqa; EngineConfig.xqa_decode:
    # on where it can run and builds, probe_xqa)
    xqa_decode: bool = False
    # with xqa_decode, a mixed step's one-token rows too, where the split kernel would take them in its own launch
    # (from xqa_mixed_min_seqs sequences) with q rounded to float8: XQA over the step's sequences (one q row each;
    # the other rows' outputs are dropped), then the prefill kernel for the rest (EngineConfig.xqa_mixed). Off by
    # default: on an H100 (s38) it made fp8 throughput 2.4% faster (a mixed step's decodes 5.24 -> 4.23 ms), but a
    # step with a prompt and no decodes, replayed from a graph of 257 sequences, pays XQA over its padding
    # sequences: 16.4 -> 17.7 ms for one 900-token prompt
    xqa_mixed: bool = False
    xqa_mixed_min_seqs: int = DECODE_KERNEL_MIN_SEQS
    # (block table, lengths) as XQA reads them (int32 [B, M], uint32 [B, 1]), converted by the first layer of the
    # step planned last; plan() drops them. Under capture the conversion is captured once, in the first layer
    _xqa_inputs: tuple | None = None
    _xqa_scratch: tuple | None = None

    @property
    def mixed_step_graphs(self) -> bool:
        """Prefill and mixed steps capture: store_kv / rope_store_kv, then the prefill kernel (and, from
        DECODE_KERNEL_MIN_SEQS sequences, the decode kernel's mixed launch), whose grids are shapes alone. Not
        with the verify kernel on: its choice follows the host's plan, which a captured graph would freeze."""
        return not self.verify_kernel

    def plan(self, host, graph_bucket=None) -> None:
        counts = np.diff(host.query_start_loc)
        self.planned = (int(host.query_start_loc[-1]), len(host.seq_lens), int(counts.max()) if len(counts) else 0)
        self._xqa_inputs = None
        if self.xqa_decode and self._xqa_scratch is None:
            self._xqa_buffers(torch.device("cuda"))  # outside any capture

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
        decode = q.shape[0] == seq_lens.shape[0]  # T == B
        if self.fuse_rope_decode and decode and not self._runs_xqa(q, kv_cache, logit_softcap, sliding_window):
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

    def _runs_xqa(self, q, kv_cache, logit_softcap: float, sliding_window: int) -> bool:
        """Whether this decode launch (q [B, H, D]) goes to XQA: where the split kernel would round q to float8, and
        within XQA's semaphores (XQA_MAX_SEQ_HEADS: past them the split kernel takes the launch)."""
        return self._xqa_takes(q.shape[0], q, kv_cache, logit_softcap, sliding_window)

    def _xqa_takes(self, seqs: int, q, kv_cache, logit_softcap: float, sliding_window: int) -> bool:
        programs = seqs * kv_cache.shape[3]
        return (self.xqa_decode and logit_softcap <= 0 and sliding_window <= 0 and is_fp8(kv_cache.dtype)
                and programs <= XQA_MAX_SEQ_HEADS and rounds_q_to_fp8(q.shape[-1], programs, q.device))

    def _runs_xqa_mixed(self, q, kv_cache, seq_lens, logit_softcap: float, sliding_window: int) -> bool:
        """Whether a mixed step's (T > B) one-token rows go to XQA (xqa_mixed)."""
        seqs = seq_lens.shape[0]
        return (self.xqa_mixed and seqs >= self.xqa_mixed_min_seqs
                and self._xqa_takes(seqs, q, kv_cache, logit_softcap, sliding_window))

    def _xqa_mixed(self, q, kv_cache, block_tables, seq_lens, query_start_loc, scale) -> torch.Tensor:
        """XQA over every sequence of a mixed step, each with the q row of its first new token (a padding sequence,
        with none, the last row; at least one key), into [T + 1, H, D]: a one-token sequence's output lands on its
        row, every other one on the spare row T, and the prefill kernel then writes the rows of the rest."""
        num_tokens = q.shape[0]
        starts = query_start_loc[:-1].long()
        one_token = (query_start_loc[1:].long() - starts) == 1
        rows = self._xqa(q.index_select(0, starts.clamp(max=num_tokens - 1)), kv_cache, block_tables,
                         seq_lens.clamp(min=1), scale)
        out = q.new_empty((num_tokens + 1, *q.shape[1:]))
        return out.index_copy_(0, torch.where(one_token, starts, num_tokens), rows)

    def _xqa(self, q, kv_cache, block_tables, seq_lens, scale):
        """Decode by flashinfer.xqa. Its softmax scale is q_scale * kv_scale / sqrt(D) and it scales P.V by
        kv_scale, so a layer's (k, v) scales pass as kv_scale = v and q_scale = scale * sqrt(D) * k / v."""
        from flashinfer.xqa import xqa
        # a capture converts again (the warm-up call before it converted eagerly, and the graph must hold its own)
        key = (block_tables.data_ptr(), block_tables.shape, seq_lens.data_ptr(),
               torch.cuda.is_current_stream_capturing())
        if self._xqa_inputs is None or self._xqa_inputs[0] != key:
            self._xqa_inputs = (key, block_tables.to(torch.int32), seq_lens.to(torch.uint32)[:, None])
        _, tables, lens = self._xqa_inputs
        batch, _, dim = q.shape
        kv_heads = kv_cache.shape[3]
        if batch * kv_heads > XQA_MAX_SEQ_HEADS:
            raise ValueError(f"xqa_decode: {batch} sequences x {kv_heads} KV heads is past the semaphores' "
                             f"{XQA_MAX_SEQ_HEADS}")
        workspace, semaphores = self._xqa_buffers(q.device)
        s = self.scales_for(kv_cache) if kv_cache.dtype != q.dtype else None
        out = torch.empty_like(q)
        xqa(q[:, None], kv_cache[0], kv_cache[1], tables, lens, out[:, None], workspace, semaphores, kv_heads,
            kv_cache.shape[2], q_scale=scale * math.sqrt(dim) * (s.k / s.v if s else 1.0),
            kv_scale=s.v if s else 1.0, enable_pdl=False)
        return out

    def probe_xqa(self, heads: int, kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype,
                  device: torch.device) -> str | None:
        """Run flashinfer.xqa once over a one-page float8 cache with this model's heads, block size and dtype: its
        first call builds the kernel (FlashInfer JIT-compiles it with nvcc, or takes it from its cache). None when it
        ran, else why not (EngineConfig.xqa_decode's default then keeps the split kernel, saying why)."""
        try:
            q = torch.zeros(1, heads, head_dim, dtype=dtype, device=device)
            cache = torch.zeros(2, 2, block_size, kv_heads, head_dim, dtype=torch.float8_e4m3fn, device=device)
            tables = torch.zeros(1, 1, dtype=torch.int32, device=device)
            lens = torch.ones(1, dtype=torch.int32, device=device)
            self._xqa(q, cache, tables, lens, head_dim ** -0.5)
            torch.cuda.synchronize(device)
        except Exception as e:  # noqa: BLE001 - any failure to build or run means: not here
            lines = str(e).strip().splitlines()
            return f"{type(e).__name__}: {lines[-1] if lines else ''}"
        finally:
            self._xqa_inputs = None
        return None

    def _xqa_buffers(self, device) -> tuple[torch.Tensor, torch.Tensor]:
        """XQA's scratch (256 MiB, as FlashInfer's tests give it) and its semaphores (zeroed; the kernel returns
        them to zero), allocated once at the first plan: graphs captured later keep their addresses."""
        if self._xqa_scratch is None:
            self._xqa_scratch = (torch.zeros(XQA_SCRATCH_BYTES, dtype=torch.uint8, device=device),
                                 torch.zeros(3 * XQA_MAX_SEQ_HEADS + 6, dtype=torch.uint32, device=device))
        return self._xqa_scratch

    def _attend(self, q, kv_cache, block_tables, seq_lens, query_start_loc, scale, sliding_window, logit_softcap):
        if q.shape[0] == seq_lens.shape[0] and self._runs_xqa(q, kv_cache, logit_softcap, sliding_window):  # decode
            return self._xqa(q, kv_cache, block_tables, seq_lens, scale)
        if q.shape[0] == seq_lens.shape[0]:  # T == B: decode
            return paged_decode_attention(q, kv_cache[0], kv_cache[1], block_tables, seq_lens, scale,
                                          sliding_window, kv_scales=self.scales_for(kv_cache),
                                          logit_softcap=logit_softcap)
        most = self._max_new_tokens(q, seq_lens)
        if self.verify_kernel and most is not None and 1 < most <= MAX_TOKENS:
            return paged_verify_attention(q, kv_cache[0], kv_cache[1], block_tables, seq_lens, query_start_loc,
                                          scale, sliding_window, most, kv_scales=self.scales_for(kv_cache),
                                          logit_softcap=logit_softcap)
        decoded = None
        if self._runs_xqa_mixed(q, kv_cache, seq_lens, logit_softcap, sliding_window):
            decoded = self._xqa_mixed(q, kv_cache, block_tables, seq_lens, query_start_loc, scale)
        out = paged_prefill_attention(q, kv_cache[0], kv_cache[1], block_tables, seq_lens, query_start_loc,
                                      scale, sliding_window, kv_scales=self.scales_for(kv_cache),
                                      logit_softcap=logit_softcap, decoded=decoded)
        return out if decoded is None else out[:q.shape[0]]
