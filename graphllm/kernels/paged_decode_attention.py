"""Paged attention of one new token per sequence (decode), split over the KV length.

Flash decoding: program (b, kv_head, split) takes all G = Hq // Hkv query heads of its KV head
(a [BLOCK_G >= 16, D] tile for tl.dot, so each K/V tile is loaded once for the group) over its
share of the sequence's visible keys, gathered from the pages in tiles of BLOCK_N tokens. Each
sequence's own visible range is cut into num_splits tile-aligned chunks on device, so short
sequences use few splits and the grid depends on shapes only (CUDA-graph safe). Splits write a
normalised partial output and its log2-sum-exp2; a second kernel merges them. With one split
the first kernel writes the output directly.

In a mixed step (query_start_loc given) q holds every new token of the step: program b reads
sequence b's token at row query_start_loc[b] when b has exactly one new token and exits
otherwise, so the one-token rows of a mixed step run this kernel's loop without the host
slicing them out (the prefill kernel takes the other sequences).

A float8 cache (graphllm/kernels/kv_quant.py) is read with its per-tensor scales folded out of the
inner loop: K and V tiles convert exactly to q's dtype for tl.dot (float16 for bfloat16 queries; on
sm_89+ as they are loaded, graphllm/kernels/fp8_convert.py), k_scale multiplies the softmax scale on
the host and v_scale the unnormalised output once per program.

Gemma 2's attention-logit soft cap (logit_softcap > 0) turns the scaled scores s into
cap * tanh(s / cap) before the mask: in the kernels' log2 domain that is c * tanh(s2 / c) with
c = cap * log2(e), behind a constexpr so that uncapped launches keep their instructions.
"""

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from graphllm.kernels.attention_loop import FP8_MAX, one_token_attention
from graphllm.kernels.fp8_convert import fp8_dots_on, kv_fp8_mode
from graphllm.kernels.gdc import dependent_start
from graphllm.kernels.kv_quant import FP8_QK_HEAD_DIM, KVScales, dequantize_kv
from graphllm.kernels.launch import pdl_launch
from graphllm.kernels.quant_layout import correctly_rounded_div
from graphllm.kernels.reference import soft_cap
from graphllm.kernels.rope_decode import NewTokens, exact_mul_on, head_rstd, rotate_rows, store_new_token
from graphllm.kernels.split_merge import merge_splits

LOG2E = 1.4426950408889634
FULL_WAVES = 4  # split until about this many (sequence, KV head, split) programs per SM
MAX_SPLITS = 8
LATENCY_SPLITS = 4  # when even MAX_SPLITS leaves SMs idle
MIN_TILES_PER_SPLIT = 4  # on the longest possible sequence (M pages)
# a float8 cache's decode tiles (decode_tiling), from kernel_sweep attention on the H200 (2026-12-02, 8B heads):
# read by this many (sequence, KV head) programs or more, its key loop runs over the head's two halves
# (32 sequences at 8 KV heads and up, where they measured faster); in one split by FP8_WIDE_TILE_PROGRAMS or more,
# over 128-key tiles in a 2-stage pipeline too (128 sequences and up)
FP8_HALVES_PROGRAMS = 256
FP8_WIDE_TILE_PROGRAMS = 1024
# ...and where the GPU has float8 wgmma (sm_90), FP8_QK_HEAD_DIM-wide heads (kv_quant.py) instead round q to float8
# there and take q.K on it (fp8_qk), in 64-key tiles over 2 stages: the key tile no longer crosses shared memory twice
# (2026-12-02 H200: 190.9 us against 204.0 at 256 x 1,024 keys, 98.6 against 109.3 at 128, 32.9 against 34.7 at 32,
# 128.3 against 129.1 at 192 x 850)
CPU_SM_COUNT = 8  # stand-in for the interpreter


def paged_decode_attention_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                     block_tables: torch.Tensor, seq_lens: torch.Tensor,
                                     scale: float, sliding_window: int,
                                     kv_scales: KVScales = KVScales(), logit_softcap: float = 0.0,
                                     fp8_qk: bool = False) -> torch.Tensor:
    """The float32 oracle: per sequence, gather its pages, soft-cap, mask the window, softmax. [B, Hq, D].

    A float8 cache is read as float(x) * kv_scales. fp8_qk: with q rounded to float8 per head
    (quantize_query_heads_reference), what paged_decode_attention's fp8_qk computes."""
    num_heads, num_kv_heads = q.shape[1], k_cache.shape[2]
    queries = quantize_query_heads_reference(q) if fp8_qk else q.float()
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    for b, seq_len in enumerate(seq_lens.tolist()):
        if seq_len == 0:
            continue
        pages = block_tables[b, :triton.cdiv(seq_len, k_cache.shape[1])]
        keys = dequantize_kv(k_cache[pages].flatten(0, 1)[:seq_len], kv_scales.k)  # [L, Hkv, D] float32
        values = dequantize_kv(v_cache[pages].flatten(0, 1)[:seq_len], kv_scales.v)
        keys = keys.repeat_interleave(num_heads // num_kv_heads, dim=1)  # [L, Hq, D]
        values = values.repeat_interleave(num_heads // num_kv_heads, dim=1)
        scores = soft_cap(torch.einsum("hd,lhd->hl", queries[b], keys) * scale, logit_softcap)  # [Hq, L]
        if sliding_window > 0:
            scores[:, :max(seq_len - sliding_window, 0)] = float("-inf")
        out[b] = torch.einsum("hl,lhd->hd", scores.softmax(-1), values)
    return out.to(q.dtype)


def quantize_query_heads_reference(q: torch.Tensor) -> torch.Tensor:
    """q [..., D] rounded to float8 e4m3fn per head (its last dim) with the scale max|head| / 448 (1 for a head of
    zeros), back in float32: the query attention_loop.quantize_query_heads gives fp8_qk's dots."""
    qf = q.float()
    amax = qf.abs().amax(-1, keepdim=True)
    # correctly rounded, as the kernel's div_rn (by a Python float, CUDA multiplies by the reciprocal: the GPU test
    # of the kernel's rounding failed on that, 2026-12-02)
    scale = torch.where(amax > 0, correctly_rounded_div(amax, FP8_MAX.value), torch.ones_like(amax))
    return (qf / scale).clamp(-FP8_MAX.value, FP8_MAX.value).to(torch.float8_e4m3fn).float() * scale


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return CPU_SM_COUNT
    return torch.cuda.get_device_properties(device).multi_processor_count


def default_num_splits(batch: int, num_kv_heads: int, max_tokens: int, block_n: int,
                       device: torch.device, latency_splits: int = LATENCY_SPLITS) -> int:
    """Splits of the keys per (sequence, KV head), from shapes only (no host sync, CUDA-graph safe).

    Enough splits for about FULL_WAVES programs per SM, at most MAX_SPLITS; LATENCY_SPLITS when
    even MAX_SPLITS would not give every SM a program; never fewer than MIN_TILES_PER_SPLIT
    tiles of block_n per split on a sequence of max_tokens (M * block_size). Fitted to the H200
    (132 SMs), 8 KV heads, max_tokens 2048 (kernel_sweep attention, split kernel + merge kernel,
    us per call): batch 1 ctx 256 4 splits 5.98 against 8 splits 6.77 and 2 splits 7.8; batch 8
    ctx 512 8 splits 11.9 against 5 splits 13.2, 4 splits 12.9 and 16 splits 14.6; batch 32
    ctx 1024 2 splits best; batch >= 128 1 split (4.0-4.26 TB/s). latency_splits: in place of LATENCY_SPLITS
    (paged_decode_attention gives 256-wide heads, whose tiles hold half the keys, 8: Gemma 2's heads at batch 1,
    kernel_sweep attention-gemma 2026-11-29, ctx 256 8 splits 6.9 us against 4 splits 8.7, ctx 512 9.1 against
    12.9, ctx 128 a tie at 6.6).
    """
    programs = batch * num_kv_heads
    sms = _sm_count(device)
    if programs * MAX_SPLITS < sms:
        splits = latency_splits
    else:
        splits = min(MAX_SPLITS, FULL_WAVES * sms // programs)
    cap = triton.cdiv(max_tokens, block_n * MIN_TILES_PER_SPLIT)
    return max(1, min(splits, cap))


def decode_block_n(head_dim: int) -> int:
    """Keys per tile of _decode_split_kernel: 64, or 32 for heads wider than 128 (registers); decode_tiling may
    widen a float8 cache's."""
    return 32 if head_dim > 128 else 64


@dataclass(frozen=True)
class DecodeTiling:
    """How _decode_split_kernel walks the keys: tile (BLOCK_N), pipeline depth, one_token_attention's HALVES, and
    its FP8_QK (q rounded to float8 per head, q.K in float8)."""
    block_n: int
    num_stages: int = 3
    head_halves: bool = False
    fp8_qk: bool = False


def fp8_qk_on(device: torch.device) -> bool:
    """decode_tiling may round q to float8 for q.K: a CUDA device with float8 wgmma (sm_90+), where it was measured."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (9, 0)


def rounds_q_to_fp8(head_dim: int, programs: int, device: torch.device) -> bool:
    """Whether the default launch over a float8 cache rounds q to float8 for q.K (decode_tiling's fp8_qk): on
    sm_90+, for FP8_QK_HEAD_DIM-wide heads read by FP8_HALVES_PROGRAMS (sequence, KV head) programs or more."""
    return fp8_qk_on(device) and decode_tiling(head_dim, True, False, programs, True).fp8_qk  # fp8_mma


def decode_tiling(head_dim: int, fp8: bool, direct: bool, programs: int, fp8_mma: bool = False) -> DecodeTiling:
    """paged_decode_attention's default tiling. A bf16 cache, or a float8 one read by few programs: decode_block_n's
    tile over 3 stages. A float8 cache read by FP8_HALVES_PROGRAMS (sequence, KV head) programs or more: with
    fp8_mma (fp8_qk_on) and FP8_QK_HEAD_DIM-wide heads, q rounded to float8 and q.K on the float8 MMA in 64-key tiles
    over 2 stages (the constants' comment has the measurements); else the key loop over the two halves of the head
    (88 registers a thread against 128 under Triton 3.6: 5 programs an SM against 4), and in one split (direct) by
    FP8_WIDE_TILE_PROGRAMS or more, 128-key tiles over 2 stages as well.

    kernel_sweep attention on the H200 (2026-12-02, 8B heads, us per call; the earlier default beside each):
    256 x 1,024 keys 203.5 against 227.6 (128-key tiles), 192 x 850 128.6 against 147.3, 128 x 1,024 108.7 against
    126.8 (64-key tiles; their halves 114.9), 32 x 1,024 (two splits) 34.4 against 38.0 with 64-key halves (128-key
    halves 37.9). ncu at 256 x 1,024: DRAM 52% busy against 48%, the warps stalled mostly on shared memory (the
    tiles go from shared memory to registers, are converted, and go back for the MMAs). Heads wider than 128 keep
    their 32-key tiles: not measured."""
    tile = decode_block_n(head_dim)
    if not fp8 or head_dim > 128 or programs < FP8_HALVES_PROGRAMS:
        return DecodeTiling(tile)
    if fp8_mma and head_dim == FP8_QK_HEAD_DIM:
        return DecodeTiling(64, num_stages=2, fp8_qk=True)
    if direct and programs >= FP8_WIDE_TILE_PROGRAMS:
        return DecodeTiling(128, num_stages=2, head_halves=True)
    return DecodeTiling(tile, head_halves=True)


def decode_num_splits(batch: int, num_kv_heads: int, max_tokens: int, head_dim: int, device: torch.device) -> int:
    """paged_decode_attention's default splits: default_num_splits with LATENCY_SPLITS scaled to the tile, so
    that a split holds as many keys at batch 1 whatever the head width (8 for Gemma 2's 256-wide heads)."""
    block_n = decode_block_n(head_dim)
    return default_num_splits(batch, num_kv_heads, max_tokens, block_n, device, LATENCY_SPLITS * 64 // block_n)


def split_buffers(q: torch.Tensor, out: torch.Tensor, rows: int, num_heads: int, num_splits: int,
                  width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(part_out [rows, heads, splits, width], part_lse [rows, heads, splits]) in float32, where the split
    kernels leave normalised partial outputs and their log2-sum-exp2 for the merge kernel; with one split
    (the kernels then write `out` directly) `out` twice, unused."""
    if num_splits == 1:
        return out, out
    return (q.new_empty((rows, num_heads, num_splits, width), dtype=torch.float32),
            q.new_empty((rows, num_heads, num_splits), dtype=torch.float32))


@triton.jit
def _query_row(query_start_loc_ptr, b, MIXED: tl.constexpr):
    """Row of sequence b's new token in q and out: b, or in a mixed step query_start_loc[b], with
    -1 when b has not exactly one new token there (its program exits)."""
    row = b.to(tl.int64)
    if MIXED:
        row = tl.load(query_start_loc_ptr + b).to(tl.int64)
        row = tl.where(tl.load(query_start_loc_ptr + b + 1) - row == 1, row, -1)
    return row


@triton.jit(do_not_specialize=["stride_bt", "num_splits"])  # vary per step: one compile
def _decode_split_kernel(q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr,
                         query_start_loc_ptr, out_ptr, part_out_ptr, part_lse_ptr,
                         stride_qb, stride_qh, stride_ob, stride_oh,
                         stride_cb, stride_co, stride_ch,  # k/v cache: block, offset, head
                         stride_bt, scale_log2, v_scale, softcap_log2, sliding_window, num_splits,
                         block_size: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_G: tl.constexpr,
                         BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, DIRECT: tl.constexpr,
                         MIXED: tl.constexpr, PRECISION: tl.constexpr, KV_FP8: tl.constexpr,
                         SOFTCAP: tl.constexpr, PDL: tl.constexpr = False, HEADS_FIRST: tl.constexpr = False,
                         ROPE: tl.constexpr = False, EXACT_MUL: tl.constexpr = False, k_new_ptr=None, v_new_ptr=None,
                         cos_ptr=None, sin_ptr=None, slot_ptr=None, stride_kt=0, stride_kh=0, stride_vt=0, stride_vh=0,
                         stride_ct=0, k_store_scale=1.0, v_store_scale=1.0, HALVES: tl.constexpr = False,
                         FP8_QK: tl.constexpr = False, NORM: tl.constexpr = False,
                         NORM_UNIT_OFFSET: tl.constexpr = False, q_norm_ptr=None, k_norm_ptr=None, norm_eps=0.0,
                         PV_WGMMA: tl.constexpr = False):
    if PDL:  # launched as a programmatic dependent (launch.py): nothing is read before the kernels before are done
        dependent_start()
    if HEADS_FIRST:  # grid (kv heads, sequences, splits): a sequence's heads run side by side
        kvh, b, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    else:
        b, kvh, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    q_row = _query_row(query_start_loc_ptr, b, MIXED)
    if MIXED:  # a constexpr branch: a plain decode launch keeps its instructions
        if q_row < 0:
            return
    seq_len = tl.load(seq_lens_ptr + b).to(tl.int32)
    start = 0
    if sliding_window > 0:
        start = tl.maximum(seq_len - sliding_window, 0)
    chunk = tl.cdiv(tl.cdiv(seq_len - start, num_splits), BLOCK_N) * BLOCK_N
    lo = start + split * chunk
    hi = tl.minimum(lo + chunk, seq_len)

    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    heads = kvh * GROUP + offs_g  # [BLOCK_G]
    g_mask = offs_g < GROUP
    d_mask = offs_d < HEAD_DIM
    q_ptrs = q_ptr + q_row * stride_qb + heads[:, None] * stride_qh + offs_d[None, :]
    q_mask = g_mask[:, None] & d_mask[None, :]
    q = tl.load(q_ptrs, mask=q_mask, other=0.0)  # [BLOCK_G, BLOCK_D]
    if ROPE:  # rotate q; the program whose range holds the new token rotates and stores it (rope_decode.py)
        cos = tl.load(cos_ptr + q_row * stride_ct + offs_d, mask=d_mask, other=0.0).to(tl.float32)
        sin = tl.load(sin_ptr + q_row * stride_ct + offs_d, mask=d_mask, other=0.0).to(tl.float32)
        rstd = 1.0
        if NORM:  # the heads' RMSNorm first (rope_decode.py's HeadNorms)
            rstd = head_rstd(q, norm_eps, HEAD_DIM)
        q = rotate_rows(q_ptrs, q, offs_d, q_mask, cos, sin, HEAD_DIM // 2, EXACT_MUL, q_norm_ptr, rstd, NORM,
                        NORM_UNIT_OFFSET)
        if (lo <= seq_len - 1) & (seq_len - 1 < hi):
            store_new_token(k_new_ptr, v_new_ptr, cos, sin, slot_ptr, q_row, kvh, stride_kt, stride_kh, stride_vt,
                            stride_vh, k_cache_ptr, v_cache_ptr, stride_cb, stride_co, stride_ch, block_size,
                            k_store_scale, v_store_scale, offs_d, d_mask, HEAD_DIM // 2, KV_FP8, EXACT_MUL,
                            k_norm_ptr, norm_eps, NORM, NORM_UNIT_OFFSET)
        tl.debug_barrier()  # the stores are visible to this program's threads before its key loop reads them
    table = block_tables_ptr + b.to(tl.int64) * stride_bt
    acc, l_i, m_i = one_token_attention(q, k_cache_ptr, v_cache_ptr, table, kvh, lo, hi, block_size,
                                         stride_cb, stride_co, stride_ch, scale_log2, v_scale, softcap_log2,
                                         BLOCK_G, BLOCK_D, HEAD_DIM, BLOCK_N, PRECISION, KV_FP8, SOFTCAP, HALVES,
                                         FP8_QK, PV_WGMMA)

    l_safe = tl.where(l_i > 0, l_i, 1.0)  # l_i = 0: empty range, zeros and lse -inf
    out = acc / l_safe[:, None]
    o_mask = g_mask[:, None] & d_mask[None, :]
    if DIRECT:
        o_off = q_row * stride_ob + heads[:, None] * stride_oh + offs_d[None, :]
        tl.store(out_ptr + o_off, out.to(out_ptr.dtype.element_ty), mask=o_mask)
    else:
        # part_out: [B, Hq, S, D], part_lse: [B, Hq, S]; row = (b * Hq + head) * S + split
        num_kv_heads = tl.num_programs(0) if HEADS_FIRST else tl.num_programs(1)
        row = (b * (GROUP * num_kv_heads) + heads).to(tl.int64) * num_splits + split
        tl.store(part_out_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], out, mask=o_mask)
        lse = tl.where(l_i > 0, m_i + tl.log2(l_safe), float("-inf"))
        tl.store(part_lse_ptr + row, lse, mask=g_mask)


@triton.jit(do_not_specialize=["num_splits"])
def _decode_reduce_kernel(part_out_ptr, part_lse_ptr, query_start_loc_ptr, out_ptr, stride_ob, stride_oh,
                          num_splits, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                          MIXED: tl.constexpr, PDL: tl.constexpr = False):
    if PDL:
        dependent_start()
    b, h = tl.program_id(0), tl.program_id(1)
    q_row = _query_row(query_start_loc_ptr, b, MIXED)
    if MIXED:
        if q_row < 0:  # its partials were never written
            return
    row = (b * tl.num_programs(1) + h).to(tl.int64) * num_splits  # first split of (b, h)
    out = merge_splits(part_out_ptr, part_lse_ptr, row, num_splits, HEAD_DIM, BLOCK_D)
    offs_d = tl.arange(0, BLOCK_D)
    tl.store(out_ptr + q_row * stride_ob + h * stride_oh + offs_d,
             out.to(out_ptr.dtype.element_ty), mask=offs_d < HEAD_DIM)


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                           sliding_window: int, num_splits: int | None = None,
                           kv_scales: KVScales = KVScales(), query_start_loc: torch.Tensor | None = None,
                           out: torch.Tensor | None = None, num_warps: int = 4,
                           logit_softcap: float = 0.0, maxnreg: int | None = None,
                           fp8_conversion: int | None = None, block_n: int | None = None,
                           num_stages: int | None = None, heads_first: bool = False,
                           new_tokens: NewTokens | None = None, head_halves: bool | None = None,
                           fp8_qk: bool | None = None, pv_wgmma: bool = False) -> torch.Tensor:
    """Attention of each sequence's single new token over its paged keys; returns [B, Hq, D].

    q: [B, Hq, D] (last-dim stride 1); k_cache, v_cache: [num_blocks, block_size, Hkv, D] views
    of one layer's kv_cache (same strides); block_tables: [B, M] int64/int32 (padded with any
    valid id); seq_lens: [B] tokens in cache including the new one, which sits at position
    seq_len - 1 and sees keys max(0, seq_len - sliding_window) .. seq_len - 1 (all keys when
    sliding_window <= 0). A sequence with seq_len 0 gets zeros. Output in q's dtype, softmax in
    float32. num_splits None: default_num_splits from shapes (no host sync either way). A
    float8_e4m3fn cache is read as float(x) * kv_scales. logit_softcap > 0: the scaled scores s
    become logit_softcap * tanh(s / logit_softcap) before the window mask (Gemma 2).

    Mixed step: with query_start_loc ([B + 1]) q is [T, Hq, D], the step's new tokens; only the
    rows of sequences with exactly one new token are computed, into `out` ([T, Hq, D], made
    when None; other rows are left as they are), which is returned.

    num_warps: of the split kernel (4, what was measured; kernel_sweep attention also times 8). Built
    offline for sm_90 with the launcher's divisibility hints (benchmarks/attention_sass.py
    --runtime-hints, triton 3.9) the 4-warp kernel takes 109 registers and spills nothing (an fp8
    cache's: 108 converted as loaded, fp8_convert.FP8_CVT; 149 with Triton's conversion); maxnreg caps
    them (kernel_sweep attention times the fp8 kernel at 128). fp8_conversion: a float8 cache's KV_FP8
    (None: fp8_convert.kv_fp8_mode; kernel_sweep attention times both conversions). block_n, num_stages and
    head_halves (one_token_attention's HALVES: fewer live registers, so more programs an SM), each None:
    decode_tiling's; they and heads_first (the grid as (kv heads, sequences, splits), so that the programs
    running together read a token's heads side by side) are kernel_sweep attention's knobs for a float8 cache's
    decode, which at 128+ sequences reads half bf16's bytes in 0.8-0.9x its time. fp8_qk (a float8 cache, sm_89+
    or the interpreter): one_token_attention's FP8_QK, q.K in float8 with q rounded per head
    (paged_decode_attention_reference's fp8_qk); None: decode_tiling's (on for 128-wide heads from
    FP8_HALVES_PROGRAMS programs on sm_90+). pv_wgmma (with fp8_qk): one_token_attention's PV_WGMMA, P.V with the
    values on the MMA's M side; kernel_sweep's attention-launch times it; not a default yet.

    new_tokens (plain decode only): q and new_tokens.k are not yet rotated, and the new keys and values are not
    yet in the cache; the kernel rotates both and stores them first (rope_decode.py), what rope_store_kv and
    then this function do, in one launch; with new_tokens.norms it RMS-norms both per head before the rotary.
    """
    num_heads, head_dim = q.shape[1:]
    mixed = query_start_loc is not None
    batch = seq_lens.shape[0] if mixed else q.shape[0]
    num_kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    assert q.stride(-1) == 1 and k_cache.stride(-1) == 1 and v_cache.stride() == k_cache.stride()
    out = torch.empty_like(q) if out is None else out
    assert out.shape == q.shape and out.stride(-1) == 1
    if batch == 0 or q.shape[0] == 0:
        return out
    if num_splits is None:
        num_splits = decode_num_splits(batch, num_kv_heads, block_tables.shape[1] * block_size, head_dim, q.device)
    group = num_heads // num_kv_heads
    direct = num_splits == 1
    part_out, part_lse = split_buffers(q, out, batch, num_heads, num_splits, head_dim)
    block_d = triton.next_power_of_2(head_dim)
    kv_fp8 = kv_fp8_mode(k_cache.dtype, q)
    kv_fp8 = fp8_conversion if kv_fp8 and fp8_conversion is not None else kv_fp8
    fp8_mma = fp8_qk_on(q.device) and fp8_qk is not False and not head_halves  # else the converted keys' tiling
    tiling = decode_tiling(head_dim, bool(kv_fp8), direct, batch * num_kv_heads, fp8_mma)
    fp8_qk = tiling.fp8_qk if fp8_qk is None else fp8_qk
    block_n = block_n or tiling.block_n
    num_stages = tiling.num_stages if num_stages is None else num_stages
    if fp8_qk:
        assert kv_fp8 and fp8_dots_on(q.device), "fp8_qk: a float8 cache on sm_89+ (or the interpreter)"
        assert not head_halves, "fp8_qk has a key loop of its own, without the head's halves"
        head_halves = False
    else:
        head_halves = tiling.head_halves if head_halves is None else head_halves
    assert fp8_qk or not pv_wgmma, "pv_wgmma: in fp8_qk's key loop"
    scale_log2 = scale * LOG2E * kv_scales.k if kv_fp8 else scale * LOG2E
    starts = query_start_loc if mixed else seq_lens  # unread unless mixed
    softcap = logit_softcap > 0
    extra = {} if new_tokens is None else rope_arguments(new_tokens, q, mixed, kv_scales)
    grid = (num_kv_heads, batch, num_splits) if heads_first else (batch, num_kv_heads, num_splits)
    _decode_split_kernel[grid](
        q, k_cache, v_cache, block_tables, seq_lens, starts, out, part_out, part_lse,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0), scale_log2, kv_scales.v, logit_softcap * LOG2E if softcap else 1.0, sliding_window,
        num_splits, block_size, GROUP=group, HEAD_DIM=head_dim, BLOCK_G=max(16, triton.next_power_of_2(group)),
        BLOCK_D=block_d, BLOCK_N=block_n, DIRECT=direct, MIXED=mixed,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", KV_FP8=kv_fp8, SOFTCAP=softcap,
        HEADS_FIRST=heads_first, HALVES=head_halves, FP8_QK=fp8_qk, PV_WGMMA=pv_wgmma, num_warps=num_warps,
        num_stages=num_stages, **extra,
        **({"maxnreg": maxnreg} if maxnreg else {}), **pdl_launch(q.device))
    if not direct:
        _decode_reduce_kernel[(batch, num_heads)](
            part_out, part_lse, starts, out, out.stride(0), out.stride(1), num_splits,
            HEAD_DIM=head_dim, BLOCK_D=block_d, MIXED=mixed,
            num_warps=4 if head_dim >= 128 else 2, **pdl_launch(q.device))
    return out


def rope_arguments(new: NewTokens, q: torch.Tensor, mixed: bool, kv_scales: KVScales) -> dict:
    """_decode_split_kernel's ROPE keywords for the step's new tokens."""
    assert not mixed, "a mixed step's decode rows read keys rope_store_kv already stored"
    tokens, _, head_dim = q.shape
    assert new.k.shape == new.v.shape and new.k.shape[0] == tokens and new.k.shape[2] == head_dim
    assert new.cos.shape == new.sin.shape == (tokens, head_dim) and new.cos.stride() == new.sin.stride()
    assert head_dim % 2 == 0 and all(x.stride(-1) == 1 for x in (new.k, new.v, new.cos))
    norms = {}
    if new.norms is not None:
        weights = (new.norms.q_weight, new.norms.k_weight)
        assert all(w.shape == (head_dim,) and w.dtype == q.dtype and w.is_contiguous() for w in weights)
        norms = dict(NORM=True, NORM_UNIT_OFFSET=new.norms.unit_offset, q_norm_ptr=weights[0], k_norm_ptr=weights[1],
                     norm_eps=new.norms.eps)
    return dict(ROPE=True, EXACT_MUL=exact_mul_on(q), k_new_ptr=new.k, v_new_ptr=new.v, cos_ptr=new.cos,
                sin_ptr=new.sin, slot_ptr=new.slot_mapping, stride_kt=new.k.stride(0), stride_kh=new.k.stride(1),
                stride_vt=new.v.stride(0), stride_vh=new.v.stride(1), stride_ct=new.cos.stride(0),
                k_store_scale=kv_scales.k, v_store_scale=kv_scales.v, **norms)
