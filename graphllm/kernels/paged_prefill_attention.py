"""Variable-length causal attention of a step's new tokens over their paged KV cache.

Covers prefill, chunked prefill (prefix already cached) and mixed batches with 1-token
sequences; every key, the new tokens' own included, is read from the cache. A sequence with one
new token (a decode in a mixed step) takes the decode kernel's loop: its G query heads as a
[16, D] tile rather than the [BLOCK_M, D] tile of a chunk. In a step of at least
DECODE_KERNEL_MIN_SEQS sequences those rows go to the decode kernel itself, launched first over
the whole step in its mixed mode (each program finds its row in query_start_loc and exits unless
its sequence has exactly one new token), and this kernel's programs of them exit. On the H200
(kernel_sweep mixed, 2026-11-21) 256 decoding rows of 850 tokens took 279 us a layer here
against 224 us in the decode kernel; 64 rows 73 against 60 us. A second launch costs host time
in a step that is not graphed, which pays only where the GPU, not the host, sets the pace of a
mixed step: with many sequences decoding. Program
(tile, kv_head) (a 1-D grid in heaviest_first's order: the last tiles, which see the most keys,
first) takes BLOCK_Q = BLOCK_M // G consecutive new tokens of one sequence times the G
query heads of its KV head, flattened into BLOCK_M rows (row r: token r // G, head r % G), so
each K/V tile serves the whole group. Each sequence's tokens are tiled on their own; tile i of
the grid belongs to the last sequence b with query_start_loc[b] // BLOCK_Q + b <= i (found by
binary search), so the grid cdiv(T, BLOCK_Q) + B bounds the tile count from shapes alone and
programs past their sequence's tokens exit (vLLM's unified-attention trick; no host sync).
A float8 cache is read as in the decode kernel: tiles converted exactly to q's dtype, k_scale
folded into the softmax scale on the host, v_scale applied once to the unnormalised output.
Gemma 2's soft cap (logit_softcap > 0) is applied to the scaled scores before the mask, as in the
decode kernel (soft_cap_log2, behind the SOFTCAP constexpr).
"""

import torch
import triton
import triton.language as tl

from graphllm.kernels.attention_loop import one_token_attention, rows_attention
from graphllm.kernels.paged_decode_attention import paged_decode_attention
from graphllm.kernels.fp8_convert import kv_fp8_mode
from graphllm.kernels.kv_quant import KVScales, dequantize_kv
from graphllm.kernels.reference import soft_cap

LOG2E = 1.4426950408889634
# From this many sequences a step's one-token rows run in the decode kernel's own launch. Not yet
# measured end to end: a throughput mixed step (255 decodes) took 24-26 ms of host time to launch
# and about as much GPU time, so there the launch is hidden and the GPU saves ~1.8 ms a step.
DECODE_KERNEL_MIN_SEQS = 128
# the prefill kernel's (query rows, keys, warps) a tile for heads up to 128 wide (wider: 32 keys, 8 warps); rows are
# at least the group's heads. Steps of long prompts (LONG_PROMPT_TOKENS a sequence or more, on average) take
# LONG_PROMPT_TILE: kernel_sweep's prefill part on an H100 (s38), 8B heads, TFLOP/s default -> long tile: one prompt
# of 8,192 tokens 347 -> 384, two of 2,048 274 -> 284; and the other way for short ones: 16 of 512 176 -> 161,
# 8 of 1,024 241 -> 236, one of 900 159 -> 149
PREFILL_TILE = (64, 64, 4)
LONG_PROMPT_TILE = (128, 128, 8)
LONG_PROMPT_TOKENS = 2048


def paged_prefill_attention_reference(q: torch.Tensor, k_cache: torch.Tensor,
                                      v_cache: torch.Tensor, block_tables: torch.Tensor,
                                      seq_lens: torch.Tensor, query_start_loc: torch.Tensor,
                                      scale: float, sliding_window: int,
                                      kv_scales: KVScales = KVScales(), logit_softcap: float = 0.0) -> torch.Tensor:
    """The float32 oracle: per sequence, gather its pages, soft-cap, causal (+ window) mask, softmax.

    A float8 cache is read as float(x) * kv_scales."""
    num_heads, num_kv_heads = q.shape[1], k_cache.shape[2]
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    starts = query_start_loc.tolist()
    for b, seq_len in enumerate(seq_lens.tolist()):
        first, last = starts[b], starts[b + 1]
        if first == last:
            continue
        pages = block_tables[b, :triton.cdiv(seq_len, k_cache.shape[1])]
        keys = dequantize_kv(k_cache[pages].flatten(0, 1)[:seq_len], kv_scales.k)  # [L, Hkv, D] float32
        values = dequantize_kv(v_cache[pages].flatten(0, 1)[:seq_len], kv_scales.v)
        keys = keys.repeat_interleave(num_heads // num_kv_heads, dim=1)  # [L, Hq, D]
        values = values.repeat_interleave(num_heads // num_kv_heads, dim=1)
        scores = soft_cap(torch.einsum("thd,lhd->htl", q[first:last].float(), keys) * scale,
                          logit_softcap)  # [Hq, t, L]
        q_pos = torch.arange(seq_len - (last - first), seq_len, device=q.device)[:, None]  # [t, 1]
        k_pos = torch.arange(seq_len, device=q.device)[None, :]  # [1, L]
        visible = k_pos <= q_pos
        if sliding_window > 0:
            visible &= k_pos > q_pos - sliding_window
        scores = scores.masked_fill(~visible, float("-inf"))
        out[first:last] = torch.einsum("htl,lhd->thd", scores.softmax(-1), values)
    return out.to(q.dtype)


@triton.jit
def _find_seq(query_start_loc_ptr, tile, num_seqs, BLOCK_Q: tl.constexpr):
    """The last sequence b whose first tile (query_start_loc[b] // BLOCK_Q + b) is <= tile."""
    left = 0
    right = num_seqs
    while left < right:
        mid = (left + right) // 2
        first_tile = (tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid).to(tl.int32)
        if first_tile <= tile:
            left = mid + 1
        else:
            right = mid
    return left - 1


@triton.jit
def _query_tile(query_start_loc_ptr, tile, num_seqs, BLOCK_Q: tl.constexpr):
    """Program `tile`'s sequence b, its first query row, its number of query rows, and the tile's first token
    counted within the sequence (past q_len: the program has nothing to do)."""
    b = _find_seq(query_start_loc_ptr, tile, num_seqs, BLOCK_Q)
    q_first = tl.load(query_start_loc_ptr + b).to(tl.int32)
    q_len = tl.load(query_start_loc_ptr + b + 1).to(tl.int32) - q_first
    return b, q_first, q_len, (tile - (q_first // BLOCK_Q + b)) * BLOCK_Q


@triton.jit
def heaviest_first(GROUPS: tl.constexpr):
    """(query tile, head group) of this program in a 1-D grid of tiles x GROUPS programs: heads fastest and the
    tiles from the last one down. A causal prompt's later tiles see more keys, and the GPU starts programs in
    grid order, so the longest ones start first and the short ones fill the tail (FlashAttention's reverse
    causal order)."""
    pid = tl.program_id(0)
    return tl.num_programs(0) // GROUPS - 1 - pid // GROUPS, pid % GROUPS


@triton.jit
def _one_token(q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, out_ptr, b, kvh, token, seq_len,
               stride_qt, stride_qh, stride_ot, stride_oh, stride_cb, stride_co, stride_ch, stride_bt,
               scale_log2, v_scale, softcap_log2, sliding_window, block_size, GROUP: tl.constexpr,
               HEAD_DIM: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
               PRECISION: tl.constexpr, KV_FP8: tl.constexpr, SOFTCAP: tl.constexpr):
    """Attention of sequence b's single new token (row `token`), all G heads of KV head kvh at once:
    a [BLOCK_G, D] query tile instead of [BLOCK_M, D], a quarter of the work for GQA 4."""
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    heads = kvh * GROUP + offs_g
    mask = (offs_g < GROUP)[:, None] & (offs_d < HEAD_DIM)[None, :]
    q = tl.load(q_ptr + token.to(tl.int64) * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                mask=mask, other=0.0)  # [BLOCK_G, BLOCK_D]
    lo = 0
    if sliding_window > 0:
        lo = tl.maximum(seq_len - sliding_window, 0)
    acc, l_i, _ = one_token_attention(q, k_cache_ptr, v_cache_ptr, block_tables_ptr + b.to(tl.int64) * stride_bt,
                                       kvh, lo, seq_len, block_size, stride_cb, stride_co, stride_ch, scale_log2,
                                       v_scale, softcap_log2, BLOCK_G, BLOCK_D, HEAD_DIM, BLOCK_N, PRECISION, KV_FP8,
                                       SOFTCAP)
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(out_ptr + token.to(tl.int64) * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["stride_bt", "num_seqs"])  # vary per step: one compile
def _prefill_kernel(q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr,
                    query_start_loc_ptr, out_ptr,
                    stride_qt, stride_qh, stride_ot, stride_oh,
                    stride_cb, stride_co, stride_ch,  # k/v cache: block, offset, head
                    stride_bt, scale_log2, v_scale, softcap_log2, sliding_window, num_seqs, block_size: tl.constexpr,
                    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_Q: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
                    BLOCK_N: tl.constexpr, ONE_TOKEN_ROWS: tl.constexpr, PRECISION: tl.constexpr,
                    KV_FP8: tl.constexpr, SOFTCAP: tl.constexpr, NUM_KV_HEADS: tl.constexpr,
                    WINDOWED: tl.constexpr = False):
    tile, kvh = heaviest_first(NUM_KV_HEADS)
    b, q_first, q_len, q_tile_start = _query_tile(query_start_loc_ptr, tile, num_seqs, BLOCK_Q)
    if q_tile_start >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + b).to(tl.int32)
    if q_len == 1:  # a decode of a mixed step
        if ONE_TOKEN_ROWS:  # here, through the decode kernel's [BLOCK_G, D] loop
            _one_token(q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, out_ptr, b, kvh, q_first, seq_len,
                       stride_qt, stride_qh, stride_ot, stride_oh, stride_cb, stride_co, stride_ch, stride_bt,
                       scale_log2, v_scale, softcap_log2, sliding_window, block_size, GROUP, HEAD_DIM, BLOCK_G,
                       BLOCK_D, BLOCK_N, PRECISION, KV_FP8, SOFTCAP)
        return  # else the decode kernel's launch computes its rows
    prefix = seq_len - q_len  # position of the sequence's first new token

    rows = tl.arange(0, BLOCK_M)
    toks = q_tile_start + rows // GROUP  # [BLOCK_M] local token of each row
    heads = kvh * GROUP + rows % GROUP
    row_valid = (rows < BLOCK_Q * GROUP) & (toks < q_len)
    q_pos = prefix + toks  # [BLOCK_M]
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    q_off = (q_first + toks).to(tl.int64)[:, None] * stride_qt + heads[:, None] * stride_qh \
        + offs_d[None, :]  # [BLOCK_M, BLOCK_D]
    q_mask = row_valid[:, None] & d_mask[None, :]
    q = tl.load(q_ptr + q_off, mask=q_mask, other=0.0)

    hi = tl.minimum(prefix + q_tile_start + BLOCK_Q, seq_len)  # past the tile's last position
    q_min_key = tl.zeros([BLOCK_M], tl.int32)  # first visible key position of each row
    lo = 0
    if WINDOWED:  # sliding_window > 0
        q_min_key = q_pos - sliding_window + 1
        lo = tl.maximum(prefix + q_tile_start - sliding_window + 1, 0)
    table = block_tables_ptr + b.to(tl.int64) * stride_bt
    acc, l_i, _ = rows_attention(q, q_pos, q_min_key, k_cache_ptr, v_cache_ptr, table, kvh, lo, hi, block_size,
                                 stride_cb, stride_co, stride_ch, scale_log2, v_scale, softcap_log2, BLOCK_M, BLOCK_D,
                                 HEAD_DIM, BLOCK_N, PRECISION, KV_FP8, SOFTCAP, True, WINDOWED)
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    o_off = (q_first + toks).to(tl.int64)[:, None] * stride_ot + heads[:, None] * stride_oh \
        + offs_d[None, :]
    tl.store(out_ptr + o_off, out.to(out_ptr.dtype.element_ty), mask=q_mask)


def prefill_tile(num_tokens: int, num_seqs: int, head_dim: int) -> tuple[int, int, int]:
    """(query rows, keys, warps) of a prefill launch, from shapes alone (no host sync): heads past 128 wide take
    32-key tiles in 8 warps; steps averaging LONG_PROMPT_TOKENS new tokens a sequence or more (a mixed step's
    one-token rows count as sequences; a mixed-step graph's padding sequences too) take LONG_PROMPT_TILE; the rest
    PREFILL_TILE."""
    if head_dim > 128:
        return PREFILL_TILE[0], 32, 8
    return LONG_PROMPT_TILE if num_tokens >= LONG_PROMPT_TOKENS * num_seqs else PREFILL_TILE


def paged_prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            block_tables: torch.Tensor, seq_lens: torch.Tensor,
                            query_start_loc: torch.Tensor, scale: float,
                            sliding_window: int, kv_scales: KVScales = KVScales(),
                            decode_kernel_min_seqs: int = DECODE_KERNEL_MIN_SEQS,
                            logit_softcap: float = 0.0, num_warps: int | None = None,
                            decoded: torch.Tensor | None = None, block_m: int | None = None,
                            block_n: int | None = None, num_stages: int = 3) -> torch.Tensor:
    """Causal attention of the step's new tokens over their sequences' pages; returns [T, Hq, D].

    q: [T, Hq, D] (last-dim stride 1), sequence b's new tokens at rows
    query_start_loc[b] .. query_start_loc[b + 1] (query_start_loc: [B + 1], nondecreasing,
    int64/int32); k_cache, v_cache: [num_blocks, block_size, Hkv, D] views of one layer's
    kv_cache, with the new tokens' keys and values already stored; block_tables: [B, M];
    seq_lens: [B] tokens in cache including the new ones. New token i of sequence b sits at
    position p = seq_len - q_len + i and sees keys 0..p, or p - sliding_window + 1..p when
    sliding_window > 0. Output in q's dtype (rows of no sequence are left unwritten), softmax in
    float32; no host sync. A float8_e4m3fn cache is read as float(x) * kv_scales. With at least
    decode_kernel_min_seqs sequences, one-token sequences run in a launch of the decode kernel.
    logit_softcap > 0: the scaled scores s become logit_softcap * tanh(s / logit_softcap) before the
    mask (Gemma 2). num_warps: the prefill kernel's (None: 4, 8 for heads over 128 wide; kernel_sweep's prefill
    part times both). decoded: an output of [T (or more), Hq, D] whose one-token rows the caller has already
    written (TritonBackend's XQA launch of a mixed step's decodes): the others are written into it, and it is
    returned. block_m, block_n, num_stages: the prefill kernel's tile (query rows: tokens x the group's heads;
    keys) and pipeline depth; None: prefill_tile's (kernel_sweep's prefill part times the others).
    """
    num_tokens, num_heads, head_dim = q.shape
    num_seqs = seq_lens.shape[0]
    num_kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    assert q.stride(-1) == 1 and k_cache.stride(-1) == 1 and v_cache.stride() == k_cache.stride()
    out = torch.empty_like(q) if decoded is None else decoded
    if num_tokens == 0 or num_seqs == 0:
        return out
    decode_launch = decoded is None and num_seqs >= decode_kernel_min_seqs
    if decode_launch:
        paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale, sliding_window,
                               kv_scales=kv_scales, query_start_loc=query_start_loc, out=out,
                               logit_softcap=logit_softcap)
    group = num_heads // num_kv_heads
    tile = prefill_tile(num_tokens, num_seqs, head_dim)
    block_m = max(block_m or tile[0], triton.next_power_of_2(group))
    block_q = block_m // group
    kv_fp8 = kv_fp8_mode(k_cache.dtype, q)
    scale_log2 = scale * LOG2E * kv_scales.k if kv_fp8 else scale * LOG2E
    softcap = logit_softcap > 0
    _prefill_kernel[((triton.cdiv(num_tokens, block_q) + num_seqs) * num_kv_heads,)](
        q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, out,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0), scale_log2, kv_scales.v, logit_softcap * LOG2E if softcap else 1.0, sliding_window,
        num_seqs, block_size, GROUP=group, HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_Q=block_q,
        BLOCK_G=max(16, triton.next_power_of_2(group)), BLOCK_D=triton.next_power_of_2(head_dim),
        BLOCK_N=block_n or tile[1],
        ONE_TOKEN_ROWS=not decode_launch and decoded is None,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", KV_FP8=kv_fp8, SOFTCAP=softcap,
        NUM_KV_HEADS=num_kv_heads, WINDOWED=sliding_window > 0, num_warps=num_warps or tile[2],
        num_stages=num_stages)
    return out
