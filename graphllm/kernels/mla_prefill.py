"""Variable-length causal multi-head latent attention (DeepSeek-V2's MLA) of a step's new tokens over their
paged latent cache: prefill, chunked prefill over a cached prefix, and mixed steps with one-token sequences.

Every entry, the new tokens' own included, is read from the cache ([blocks, block_size, C], C = kv_lora_rank +
rope; graphllm/kernels/mla_reference.py is the oracle). All heads share one key, so, as paged_prefill_attention
does for a GQA group, program (tile, head block) flattens BLOCK_Q consecutive new tokens of one sequence times
BLOCK_H heads into BLOCK_M rows (row r: token r // BLOCK_H, head r % BLOCK_H of the block) and each entry tile
serves them all, as key (latent dot plus rope dot, split as in mla_decode.py) and as value (its latent). Tiles
map to sequences as in paged_prefill_attention (_query_tile over a grid of cdiv(T, BLOCK_Q) + B tiles, programs past
their sequence's tokens exit): shapes only, no host sync.

A sequence with one new token (a decode of a mixed step) runs mla_decode's one-token loop on its BLOCK_H heads;
with at least DECODE_KERNEL_MIN_SEQS sequences those rows go instead to a mixed-mode launch of the decode kernel
(paged_prefill_attention's threshold, measured there for standard attention, not for MLA). At C = 576 the tiles
are SGLang's for its MLA extend kernel on sm_90 (BLOCK_M 32, BLOCK_N 64, 8 warps, one stage); interpreter-tested
only, not measured here.
"""

import torch
import triton
import triton.language as tl

from graphllm.kernels.mla_decode import BLOCK_H as DECODE_BLOCK_H
from graphllm.kernels.mla_decode import load_mla_q, mla_decode_attention, one_token_mla
from graphllm.kernels.paged_prefill_attention import DECODE_KERNEL_MIN_SEQS, _query_tile, heaviest_first

LOG2E = 1.4426950408889634


@triton.jit
def _one_token(q_ptr, cache_ptr, table, out_ptr, token, seq_len, head_block, num_heads, stride_qt, stride_qh,
               stride_ot, stride_oh, stride_cb, stride_co, scale_log2, block_size, BLOCK_H: tl.constexpr,
               ONE_H: tl.constexpr, KV_LORA_RANK: tl.constexpr, ROPE_DIM: tl.constexpr, BLOCK_L: tl.constexpr,
               BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """The single new token (row `token`) of a sequence, heads of head_block at once: a [ONE_H >= 16, C] query
    tile instead of [BLOCK_M, C]."""
    offs_h = tl.arange(0, ONE_H)
    heads = head_block * BLOCK_H + offs_h
    h_mask = (offs_h < BLOCK_H) & (heads < num_heads)
    row = token.to(tl.int64)
    q_nope, q_pe = load_mla_q(q_ptr, row, heads, h_mask, stride_qt, stride_qh, KV_LORA_RANK, ROPE_DIM,
                              BLOCK_L, BLOCK_R)
    acc, l_i, _ = one_token_mla(q_nope, q_pe, cache_ptr, table, 0, seq_len, block_size, stride_cb, stride_co,
                                scale_log2, KV_LORA_RANK, ROPE_DIM, BLOCK_L, BLOCK_R, BLOCK_N, PRECISION)
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    offs_l = tl.arange(0, BLOCK_L)
    tl.store(out_ptr + row * stride_ot + heads[:, None] * stride_oh + offs_l[None, :],
             out.to(out_ptr.dtype.element_ty), mask=h_mask[:, None] & (offs_l < KV_LORA_RANK)[None, :])


@triton.jit(do_not_specialize=["stride_bt", "num_seqs"])  # vary per step: one compile
def _mla_prefill_kernel(q_ptr, cache_ptr, block_tables_ptr, seq_lens_ptr, query_start_loc_ptr, out_ptr,
                        stride_qt, stride_qh, stride_ot, stride_oh, stride_cb, stride_co, stride_bt,
                        scale_log2, num_seqs, block_size: tl.constexpr, num_heads,
                        KV_LORA_RANK: tl.constexpr, ROPE_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_Q: tl.constexpr, BLOCK_H: tl.constexpr, ONE_H: tl.constexpr, BLOCK_L: tl.constexpr,
                        BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, ONE_TOKEN_ROWS: tl.constexpr,
                        PRECISION: tl.constexpr, HEAD_BLOCKS: tl.constexpr):
    tile, head_block = heaviest_first(HEAD_BLOCKS)
    b, q_first, q_len, q_tile_start = _query_tile(query_start_loc_ptr, tile, num_seqs, BLOCK_Q)
    if q_tile_start >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + b).to(tl.int32)
    table = block_tables_ptr + b.to(tl.int64) * stride_bt
    if q_len == 1:  # a decode of a mixed step
        if ONE_TOKEN_ROWS:  # here, through the decode kernel's [ONE_H, C] loop
            _one_token(q_ptr, cache_ptr, table, out_ptr, q_first, seq_len, head_block, num_heads, stride_qt,
                       stride_qh, stride_ot, stride_oh, stride_cb, stride_co, scale_log2, block_size, BLOCK_H,
                       ONE_H, KV_LORA_RANK, ROPE_DIM, BLOCK_L, BLOCK_R, BLOCK_N, PRECISION)
        return  # else the decode kernel's launch computes its rows
    prefix = seq_len - q_len  # position of the sequence's first new token

    rows = tl.arange(0, BLOCK_M)
    toks = q_tile_start + rows // BLOCK_H  # [BLOCK_M] local token of each row
    heads = head_block * BLOCK_H + rows % BLOCK_H
    row_valid = (toks < q_len) & (heads < num_heads)
    q_pos = prefix + toks  # [BLOCK_M]
    q_rows = (q_first + toks).to(tl.int64)
    offs_l = tl.arange(0, BLOCK_L)
    l_mask = offs_l < KV_LORA_RANK
    q_nope, q_pe = load_mla_q(q_ptr, q_rows[:, None], heads, row_valid, stride_qt, stride_qh, KV_LORA_RANK,
                              ROPE_DIM, BLOCK_L, BLOCK_R)  # [BLOCK_M, BLOCK_L], [BLOCK_M, BLOCK_R]

    hi = tl.minimum(prefix + q_tile_start + BLOCK_Q, seq_len)  # past the tile's last position
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_L], tl.float32)
    offs_r = tl.arange(0, BLOCK_R)
    offs_n = tl.arange(0, BLOCK_N)
    for tile_n in range(0, hi, BLOCK_N):
        k_pos = tile_n + offs_n  # [BLOCK_N]
        k_valid = k_pos < hi
        pages = tl.load(table + k_pos // block_size, mask=k_valid, other=0).to(tl.int64)
        entry = cache_ptr + (pages * stride_cb + (k_pos % block_size) * stride_co)[:, None]  # [BLOCK_N, 1]
        latent = tl.load(entry + offs_l[None, :], mask=k_valid[:, None] & l_mask[None, :], other=0.0)
        k_pe = tl.load(entry + KV_LORA_RANK + offs_r[None, :],
                       mask=k_valid[:, None] & (offs_r < ROPE_DIM)[None, :], other=0.0)
        s = tl.dot(q_nope, tl.trans(latent), input_precision=PRECISION)
        s = tl.dot(q_pe, tl.trans(k_pe), s, input_precision=PRECISION) * scale_log2  # [BLOCK_M, BLOCK_N]
        s = tl.where(k_valid[None, :] & (k_pos[None, :] <= q_pos[:, None]), s, float("-inf"))  # causal
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new > float("-inf"), m_new, 0.0)  # a row may see nothing yet
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(latent.dtype), latent, input_precision=PRECISION)
        m_i = m_new

    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    o_off = q_rows[:, None] * stride_ot + heads[:, None] * stride_oh + offs_l[None, :]
    tl.store(out_ptr + o_off, out.to(out_ptr.dtype.element_ty), mask=row_valid[:, None] & l_mask[None, :])


def mla_prefill_tiles(num_heads: int, entry_dim: int) -> dict:
    """Tile sizes and launch options from the shape: rows per program, heads per program, entries per tile."""
    wide = entry_dim > 256  # DeepSeek-V2's 576: SGLang's MLA extend tiles on sm_90
    block_m = 32 if wide else 64
    block_h = min(triton.next_power_of_2(num_heads), block_m)
    return dict(BLOCK_M=block_m, BLOCK_Q=block_m // block_h, BLOCK_H=block_h, ONE_H=max(DECODE_BLOCK_H, block_h),
                BLOCK_N=64, num_warps=8 if wide else 4, num_stages=1 if wide else 2)


def mla_prefill_attention(q: torch.Tensor, cache: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
                          query_start_loc: torch.Tensor, scale: float, kv_lora_rank: int,
                          decode_kernel_min_seqs: int = DECODE_KERNEL_MIN_SEQS) -> torch.Tensor:
    """Causal MLA of the step's new tokens over their sequences' cached entries; returns [T, H, kv_lora_rank].

    q: [T, H, C] (last-dim stride 1), sequence b's new tokens at rows query_start_loc[b] .. query_start_loc[b + 1]
    (query_start_loc: [B + 1], nondecreasing); cache: [num_blocks, block_size, C] (one layer's
    kv_cache[0, :, :, 0]) with the new entries already written; block_tables: [B, M]; seq_lens: [B] entries in
    cache including the new ones. New token i of sequence b sits at position p = seq_len - q_len + i and sees
    entries 0..p. Output in q's dtype (rows of no sequence are left unwritten), softmax in float32; no host sync.
    With at least decode_kernel_min_seqs sequences, one-token sequences run in a launch of the decode kernel.
    """
    num_tokens, num_heads, entry_dim = q.shape
    num_seqs = seq_lens.shape[0]
    rope_dim = entry_dim - kv_lora_rank
    assert q.stride(-1) == 1 and cache.stride(-1) == 1 and cache.shape[-1] == entry_dim and rope_dim > 0
    out = q.new_empty((num_tokens, num_heads, kv_lora_rank))
    if num_tokens == 0 or num_seqs == 0:
        return out
    decode_launch = num_seqs >= decode_kernel_min_seqs
    if decode_launch:
        mla_decode_attention(q, cache, block_tables, seq_lens, scale, kv_lora_rank, query_start_loc=query_start_loc,
                             out=out)
    tiles = mla_prefill_tiles(num_heads, entry_dim)
    head_blocks = triton.cdiv(num_heads, tiles["BLOCK_H"])
    grid = ((triton.cdiv(num_tokens, tiles["BLOCK_Q"]) + num_seqs) * head_blocks,)
    _mla_prefill_kernel[grid](
        q, cache, block_tables, seq_lens, query_start_loc, out,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), cache.stride(0), cache.stride(1),
        block_tables.stride(0), scale * LOG2E, num_seqs, cache.shape[1], num_heads,
        KV_LORA_RANK=kv_lora_rank, ROPE_DIM=rope_dim, BLOCK_L=max(16, triton.next_power_of_2(kv_lora_rank)),
        BLOCK_R=max(16, triton.next_power_of_2(rope_dim)), ONE_TOKEN_ROWS=not decode_launch,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", HEAD_BLOCKS=head_blocks, **tiles)
    return out
