"""The attention backend interface, the shape of the attention it runs, and the host-side step
metadata it may plan from."""

from typing import NamedTuple

import numpy as np
import torch

from graphllm.kernels.kv_quant import KVScales
from graphllm.kernels.rotary import HeadNorms, apply_rotary, normed_heads


class AttentionShape(NamedTuple):
    """What a backend needs to know of the model's attention (the runtime reads it off the model config)."""

    num_heads: int  # query heads
    num_kv_heads: int
    head_dim: int
    sliding_window: int = 0  # <= 0: full attention
    logit_softcap: float = 0.0  # > 0: scores soft-capped, cap * tanh(s / cap) (Gemma 2); 0: off
    scale: float = 0.0  # softmax scale; 0: head_dim ** -0.5 (Gemma: query_pre_attn_scalar ** -0.5)
    uniform: bool = True  # every layer has this window, soft cap and scale (False: Gemma's alternating layers)
    mla: bool = False  # multi-head latent attention (DeepSeek-V2): graphllm.mla_attention over a latent cache


class HostMeta(NamedTuple):
    """CPU copies of the step's attention metadata (integer numpy), for backends that plan on the host."""

    query_start_loc: np.ndarray  # [B+1]
    seq_lens: np.ndarray  # [B] tokens in cache after this step
    block_tables: np.ndarray  # [B, M] padded with 0

    @property
    def is_decode(self) -> bool:
        """One new token per sequence."""
        return int(self.query_start_loc[-1]) == len(self.seq_lens)

    def padded(self, bucket: int, padding_block: int) -> "HostMeta":
        """A decode batch grown to `bucket` rows; each extra row caches one token in `padding_block`."""
        assert self.is_decode, "only decode steps are padded (CUDA graphs)"
        b = len(self.seq_lens)
        tables = np.zeros((bucket, self.block_tables.shape[1]), np.int64)
        tables[:b], tables[b:, 0] = self.block_tables, padding_block
        seq_lens = np.concatenate([self.seq_lens, np.ones(bucket - b, np.int64)])
        return HostMeta(np.arange(bucket + 1), seq_lens, tables)

    def paged_kv(self, block_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """CSR page lists: indptr [B+1], indices [sum pages], last_page_len [B] (CPU int32)."""
        pages = (self.seq_lens + block_size - 1) // block_size  # [B]
        indptr = np.zeros(len(pages) + 1, np.int32)
        np.cumsum(pages, out=indptr[1:])
        used = np.arange(self.block_tables.shape[1])[None, :] < pages[:, None]  # [B, M]
        last = self.seq_lens - (pages - 1) * block_size
        return (torch.from_numpy(indptr), torch.from_numpy(self.block_tables[used].astype(np.int32)),
                torch.from_numpy(last.astype(np.int32)))


class AttentionBackend:
    """Runs the attention op: the KV write, then attention of q over the pages.

    `plan` runs on the host before every step (and before every CUDA-graph replay, with the
    metadata padded to the bucket); `forward` runs inside the op, possibly under capture.
    A float8 cache is written and read with its layer's scales (graphllm.kernels.kv_quant.KVScales):
    `scales_for(kv_cache)`, the scales bound to that layer's cache tensor by `bind_layer_scales`, else
    `kv_scales`. The op hands the backend each layer's own cache tensor, so its storage names the layer
    (the lookup runs in Python, so a CUDA graph captures each layer's scales as constants).
    """

    name = "base"
    plans_on_host = False  # True: plan() fills buffers that a queued step may still read (no multi-step)
    # True: a step with prompt tokens runs kernels chosen and sized by its tensor shapes alone, with no host
    # sync, so it captures into a CUDA graph and replays at any contents (cudagraph_mode FULL)
    mixed_step_graphs = False
    kv_scales = KVScales()

    def __init__(self, kv_scales: KVScales = KVScales()):
        self.kv_scales = kv_scales
        self.layer_scales: dict[int, KVScales] = {}  # cache tensor's data_ptr -> its layer's scales

    def bind_layer_scales(self, kv_caches: list[torch.Tensor], scales: list[KVScales]) -> None:
        """Layer i's cache (kv_caches[i]) is written and read with scales[i] (a checkpoint's per-layer
        k_scale / v_scale, or a calibration's)."""
        assert len(kv_caches) == len(scales), "one KVScales per layer"
        self.layer_scales = {cache.data_ptr(): s for cache, s in zip(kv_caches, scales)}

    def scales_for(self, kv_cache: torch.Tensor) -> KVScales:
        return self.layer_scales.get(kv_cache.data_ptr(), self.kv_scales)

    def plan(self, host: HostMeta, graph_bucket: int | None = None) -> None:
        """Prepare for the next step; graph_bucket: the CUDA-graph bucket about to be captured or replayed."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                positions: torch.Tensor, slot_mapping: torch.Tensor, block_tables: torch.Tensor,
                seq_lens: torch.Tensor, query_start_loc: torch.Tensor, scale: float,
                sliding_window: int, logit_softcap: float = 0.0) -> torch.Tensor:
        raise NotImplementedError

    def mla_forward(self, q: torch.Tensor, kv: torch.Tensor, kv_cache: torch.Tensor, positions: torch.Tensor,
                    slot_mapping: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
                    query_start_loc: torch.Tensor, scale: float, kv_lora_rank: int) -> torch.Tensor:
        """graphllm.mla_attention (graphllm/ops/mla_attention.py): the torch and triton backends run it."""
        raise NotImplementedError(f"attention backend {self.name!r} does not run multi-head latent attention (MLA)")

    def rope_forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor,
                     sin: torch.Tensor, kv_cache: torch.Tensor, positions: torch.Tensor,
                     slot_mapping: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
                     query_start_loc: torch.Tensor, scale: float, sliding_window: int,
                     logit_softcap: float = 0.0, norms: HeadNorms | None = None) -> torch.Tensor:
        """forward() of q and k rotated by cos, sin ([T, D]), RMS-normed per head by norms first; backends with
        a fused rotary + KV-write kernel override it. The result is contiguous."""
        q, k = normed_heads(q, k, norms)
        return self.forward(apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v, kv_cache, positions,
                            slot_mapping, block_tables, seq_lens, query_start_loc, scale, sliding_window,
                            logit_softcap)
