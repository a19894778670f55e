"""Paged attention of a few new tokens per sequence (speculative decoding's verify steps), split over the KV length.

The decode kernel's flash decoding (paged_decode_attention.py), for sequences of 1..MAX_TOKENS new tokens:
program (b, kv_head, split) takes every new token of sequence b times the G = Hq // Hkv query heads of its
KV head as one [BLOCK_R >= 16, D] tile of rows (row r: token r // G, head r % G), so each K/V tile is loaded
once for all of them, over its share of the keys. Token t of a sequence with n new tokens sits at position
p = seq_len - n + t and sees keys 0..p (p - sliding_window + 1..p with a window): the mask is per row. The
keys are cut into num_splits tile-aligned chunks on device; splits write a normalised partial output and
its log2-sum-exp2 per (token, head), and the decode kernel's merge kernel merges them. The loop over the keys
is the prefill kernel's (attention_loop.rows_attention). The grid depends on shapes only, so a
verify step captures into a CUDA graph.

Why not the prefill kernel: it gives a sequence's query tile one program per KV head that walks every key,
8 programs at batch 1 for an 8B model, which a context of thousands of tokens makes slow; here the keys are
split until the GPU is full, as for decode.
"""

import torch
import triton
import triton.language as tl

from graphllm.kernels.fp8_convert import kv_fp8_mode
from graphllm.kernels.kv_quant import KVScales
from graphllm.kernels.attention_loop import rows_attention
from graphllm.kernels.paged_decode_attention import LOG2E, _decode_reduce_kernel, default_num_splits, split_buffers

MAX_TOKENS = 16  # new tokens per sequence this kernel takes (k + 1 of speculative decoding)


@triton.jit(do_not_specialize=["stride_bt", "num_splits"])
def _verify_split_kernel(q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, query_start_loc_ptr,
                         out_ptr, part_out_ptr, part_lse_ptr,
                         stride_qt, stride_qh, stride_ot, stride_oh,
                         stride_cb, stride_co, stride_ch,  # k/v cache: block, offset, head
                         stride_bt, scale_log2, v_scale, softcap_log2, sliding_window, num_splits,
                         block_size: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_R: tl.constexpr,
                         BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, DIRECT: tl.constexpr,
                         PRECISION: tl.constexpr, KV_FP8: tl.constexpr, SOFTCAP: tl.constexpr,
                         WINDOWED: tl.constexpr = False):
    b, kvh, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    first_row = tl.load(query_start_loc_ptr + b).to(tl.int64)
    n_new = (tl.load(query_start_loc_ptr + b + 1) - first_row).to(tl.int32)
    seq_len = tl.load(seq_lens_ptr + b).to(tl.int32)
    first_pos = seq_len - n_new  # the position of the sequence's first new token

    offs_r = tl.arange(0, BLOCK_R)
    offs_d = tl.arange(0, BLOCK_D)
    token = offs_r // GROUP  # [BLOCK_R]
    heads = kvh * GROUP + offs_r % GROUP
    r_mask = token < n_new
    d_mask = offs_d < HEAD_DIM
    q_pos = first_pos + token  # [BLOCK_R]
    rows = first_row + token  # rows of q and out
    q = tl.load(q_ptr + rows[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                mask=r_mask[:, None] & d_mask[None, :], other=0.0)  # [BLOCK_R, BLOCK_D]

    start = 0
    q_min_key = tl.zeros([BLOCK_R], tl.int32)
    if WINDOWED:  # sliding_window > 0
        start = tl.maximum(first_pos - sliding_window + 1, 0)  # the first token's window; later rows mask more
        q_min_key = q_pos - sliding_window + 1
    chunk = tl.cdiv(tl.cdiv(seq_len - start, num_splits), BLOCK_N) * BLOCK_N
    lo = start + split * chunk
    hi = tl.minimum(lo + chunk, seq_len)
    table = block_tables_ptr + b.to(tl.int64) * stride_bt
    acc, l_i, m_i = rows_attention(q, q_pos, q_min_key, k_cache_ptr, v_cache_ptr, table, kvh, lo, hi, block_size,
                                   stride_cb, stride_co, stride_ch, scale_log2, v_scale, softcap_log2, BLOCK_R,
                                   BLOCK_D, HEAD_DIM, BLOCK_N, PRECISION, KV_FP8, SOFTCAP, True, WINDOWED)

    l_safe = tl.where(l_i > 0, l_i, 1.0)  # l_i = 0: no visible key in this split, zeros and lse -inf
    out = acc / l_safe[:, None]
    o_mask = r_mask[:, None] & d_mask[None, :]
    if DIRECT:
        tl.store(out_ptr + rows[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=o_mask)
    else:
        # part_out: [T, Hq, S, D], part_lse: [T, Hq, S]
        part = (rows * (GROUP * tl.num_programs(1)) + heads) * num_splits + split
        tl.store(part_out_ptr + part[:, None] * HEAD_DIM + offs_d[None, :], out, mask=o_mask)
        lse = tl.where(l_i > 0, m_i + tl.log2(l_safe), float("-inf"))
        tl.store(part_lse_ptr + part, lse, mask=r_mask)


def paged_verify_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, seq_lens: torch.Tensor, query_start_loc: torch.Tensor,
                           scale: float, sliding_window: int, max_tokens: int, num_splits: int | None = None,
                           kv_scales: KVScales = KVScales(), logit_softcap: float = 0.0) -> torch.Tensor:
    """Causal attention of each sequence's 1..max_tokens new tokens over its pages; returns [T, Hq, D].

    The arguments are paged_prefill_attention's (q: [T, Hq, D], sequence b's new tokens at rows
    query_start_loc[b] .. query_start_loc[b + 1], their keys and values already in the cache), and
    max_tokens (<= MAX_TOKENS): no sequence has more new tokens (the caller knows it from the host's plan;
    a sequence with more would have the rows past max_tokens left unwritten). num_splits None:
    default_num_splits from shapes. Output in q's dtype, softmax in float32; no host sync.
    """
    num_tokens, num_heads, head_dim = q.shape
    num_seqs = seq_lens.shape[0]
    num_kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    assert 1 <= max_tokens <= MAX_TOKENS, max_tokens
    assert q.stride(-1) == 1 and k_cache.stride(-1) == 1 and v_cache.stride() == k_cache.stride()
    out = torch.empty_like(q)
    if num_tokens == 0 or num_seqs == 0:
        return out
    block_n = 64 if head_dim <= 128 else 32
    if num_splits is None:
        num_splits = default_num_splits(num_seqs, num_kv_heads, block_tables.shape[1] * block_size, block_n,
                                        q.device)
    group = num_heads // num_kv_heads
    direct = num_splits == 1
    part_out, part_lse = split_buffers(q, out, num_tokens, num_heads, num_splits, head_dim)
    block_d = triton.next_power_of_2(head_dim)
    kv_fp8 = kv_fp8_mode(k_cache.dtype, q)
    scale_log2 = scale * LOG2E * kv_scales.k if kv_fp8 else scale * LOG2E
    softcap = logit_softcap > 0
    _verify_split_kernel[(num_seqs, num_kv_heads, num_splits)](
        q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, out, part_out, part_lse,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0), scale_log2, kv_scales.v, logit_softcap * LOG2E if softcap else 1.0, sliding_window,
        num_splits, block_size, GROUP=group, HEAD_DIM=head_dim,
        BLOCK_R=max(16, triton.next_power_of_2(group * max_tokens)), BLOCK_D=block_d, BLOCK_N=block_n,
        DIRECT=direct, PRECISION="ieee" if q.dtype == torch.float32 else "tf32", KV_FP8=kv_fp8, SOFTCAP=softcap,
        WINDOWED=sliding_window > 0, num_warps=4, num_stages=3)
    if not direct:
        # the decode kernel's merge, one program per (token, head): part rows are laid out as its (b, head)
        _decode_reduce_kernel[(num_tokens, num_heads)](
            part_out, part_lse, query_start_loc, out, out.stride(0), out.stride(1), num_splits,
            HEAD_DIM=head_dim, BLOCK_D=block_d, MIXED=False,
            num_warps=4 if head_dim >= 128 else 2)
    return out
