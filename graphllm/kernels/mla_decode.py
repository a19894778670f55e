"""Multi-head latent attention (DeepSeek-V2's MLA) of one new token per sequence (decode), split over the
cache length.

The cache holds one entry of C = kv_lora_rank + rope values per token ([blocks, block_size, C] here) that every
query head scores against and whose first kv_lora_rank values (the latent) are the value
(graphllm/kernels/mla_reference.py, the oracle). All heads share that one key, so program (b, head block, split)
takes BLOCK_H = 16 query heads ([BLOCK_H, C], the least M of tl.dot) against tiles of BLOCK_N cached entries:
each entry tile is loaded once per head block and serves as key and value. C = 576 is no power of two, so the
score is two dots, the latent part ([BLOCK_H, BLOCK_L] x [BLOCK_L, BLOCK_N]) plus the rope part
([BLOCK_H, BLOCK_R] x [BLOCK_R, BLOCK_N]), as vLLM's and SGLang's Triton MLA decode kernels split it into
BLOCK_DMODEL and BLOCK_DPE; either part is masked up to its power of two (the tiny test configs' 24 or 8).

Splits, partial outputs with their log2-sum-exp2 and the merge are paged_decode_attention's: each sequence's
range is cut on device into num_splits tile-aligned chunks (default_num_splits, fitted to standard attention on
the H200, with head blocks in the KV heads' place: not fitted to MLA), and its _decode_reduce_kernel merges
[B, H, S, L] partials. The grid depends on shapes only (CUDA-graph safe, no host sync). In a mixed step
(query_start_loc given) program b finds its token's row in query_start_loc and exits unless sequence b has
exactly one new token, as in paged_decode_attention. Interpreter-tested and compiled for sm_90, not run on a GPU:
tile sizes are vLLM's for its MLA decode (BLOCK_H 16, BLOCK_N 32 at C 576), not measured here.
"""

import torch
import triton
import triton.language as tl

from graphllm.kernels.paged_decode_attention import _decode_reduce_kernel, _query_row, default_num_splits, split_buffers

LOG2E = 1.4426950408889634
BLOCK_H = 16  # query heads per program: the least M of tl.dot


def mla_block_n(entry_dim: int) -> int:
    """Cached entries per tile: 32 at DeepSeek-V2's 576 (vLLM's BLOCK for MLA decode), 64 for narrow entries."""
    return 32 if entry_dim > 256 else 64


@triton.jit
def load_mla_q(q_ptr, row, heads, h_mask, stride_qt, stride_qh, KV_LORA_RANK: tl.constexpr,
               ROPE_DIM: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_R: tl.constexpr):
    """One token's query rows of `heads` ([BLOCK_H]): (latent part [BLOCK_H, BLOCK_L], rope part [BLOCK_H, BLOCK_R])."""
    offs_l = tl.arange(0, BLOCK_L)
    offs_r = tl.arange(0, BLOCK_R)
    base = q_ptr + row * stride_qt + heads[:, None] * stride_qh
    q_nope = tl.load(base + offs_l[None, :], mask=h_mask[:, None] & (offs_l < KV_LORA_RANK)[None, :], other=0.0)
    q_pe = tl.load(base + KV_LORA_RANK + offs_r[None, :], mask=h_mask[:, None] & (offs_r < ROPE_DIM)[None, :],
                   other=0.0)
    return q_nope, q_pe


@triton.jit
def one_token_mla(q_nope, q_pe, cache_ptr, table, lo, hi, block_size, stride_cb, stride_co, scale_log2,
                  KV_LORA_RANK: tl.constexpr, ROPE_DIM: tl.constexpr, BLOCK_L: tl.constexpr,
                  BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """Online softmax of one token's heads (q_nope [BLOCK_H, BLOCK_L], q_pe [BLOCK_H, BLOCK_R]) over the cached
    entries at positions lo..hi-1 of the pages in `table`; returns (acc [BLOCK_H, BLOCK_L], l, m), acc
    unnormalised. Shared by the decode kernel and the prefill kernel's one-token sequences."""
    offs_l = tl.arange(0, BLOCK_L)
    offs_r = tl.arange(0, BLOCK_R)
    offs_n = tl.arange(0, BLOCK_N)
    m_i = tl.full([q_nope.shape[0]], float("-inf"), tl.float32)
    l_i = tl.zeros([q_nope.shape[0]], tl.float32)
    acc = tl.zeros([q_nope.shape[0], BLOCK_L], tl.float32)
    for tile in range(lo, hi, BLOCK_N):
        toks = tile + offs_n  # [BLOCK_N] key positions
        valid = toks < hi
        pages = tl.load(table + toks // block_size, mask=valid, other=0).to(tl.int64)  # constexpr block_size: a shift
        entry = cache_ptr + (pages * stride_cb + (toks % block_size) * stride_co)[:, None]  # [BLOCK_N, 1]
        latent = tl.load(entry + offs_l[None, :], mask=valid[:, None] & (offs_l < KV_LORA_RANK)[None, :],
                         other=0.0)  # [BLOCK_N, BLOCK_L]: key and value
        k_pe = tl.load(entry + KV_LORA_RANK + offs_r[None, :], mask=valid[:, None] & (offs_r < ROPE_DIM)[None, :],
                       other=0.0)  # [BLOCK_N, BLOCK_R]
        s = tl.dot(q_nope, tl.trans(latent), input_precision=PRECISION)
        s = tl.dot(q_pe, tl.trans(k_pe), s, input_precision=PRECISION) * scale_log2  # [BLOCK_H, BLOCK_N]
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # finite: every tile has a valid entry
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(latent.dtype), latent, input_precision=PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit(do_not_specialize=["stride_bt", "num_splits"])  # vary per step: one compile
def _mla_decode_split_kernel(q_ptr, cache_ptr, block_tables_ptr, seq_lens_ptr, query_start_loc_ptr, out_ptr,
                             part_out_ptr, part_lse_ptr, stride_qt, stride_qh, stride_ot, stride_oh,
                             stride_cb, stride_co, stride_bt, scale_log2, num_splits, block_size: tl.constexpr,
                             num_heads,
                             KV_LORA_RANK: tl.constexpr, ROPE_DIM: tl.constexpr, BLOCK_H: tl.constexpr,
                             BLOCK_L: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
                             DIRECT: tl.constexpr, MIXED: tl.constexpr, PRECISION: tl.constexpr):
    b, head_block, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    q_row = _query_row(query_start_loc_ptr, b, MIXED)
    if MIXED:  # a constexpr branch: a plain decode launch keeps its instructions
        if q_row < 0:
            return
    seq_len = tl.load(seq_lens_ptr + b).to(tl.int32)
    chunk = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    lo = split * chunk
    hi = tl.minimum(lo + chunk, seq_len)

    heads = head_block * BLOCK_H + tl.arange(0, BLOCK_H)  # [BLOCK_H]
    h_mask = heads < num_heads
    q_nope, q_pe = load_mla_q(q_ptr, q_row, heads, h_mask, stride_qt, stride_qh, KV_LORA_RANK, ROPE_DIM,
                              BLOCK_L, BLOCK_R)
    table = block_tables_ptr + b.to(tl.int64) * stride_bt
    acc, l_i, m_i = one_token_mla(q_nope, q_pe, cache_ptr, table, lo, hi, block_size, stride_cb, stride_co,
                                  scale_log2, KV_LORA_RANK, ROPE_DIM, BLOCK_L, BLOCK_R, BLOCK_N, PRECISION)

    l_safe = tl.where(l_i > 0, l_i, 1.0)  # l_i = 0: empty range, zeros and lse -inf
    out = acc / l_safe[:, None]
    offs_l = tl.arange(0, BLOCK_L)
    o_mask = h_mask[:, None] & (offs_l < KV_LORA_RANK)[None, :]
    if DIRECT:
        o_off = q_row * stride_ot + heads[:, None] * stride_oh + offs_l[None, :]
        tl.store(out_ptr + o_off, out.to(out_ptr.dtype.element_ty), mask=o_mask)
    else:
        # part_out: [B, H, S, L], part_lse: [B, H, S]; row = (b * H + head) * S + split (_decode_reduce_kernel's)
        row = (b * num_heads + heads).to(tl.int64) * num_splits + split
        tl.store(part_out_ptr + row[:, None] * KV_LORA_RANK + offs_l[None, :], out, mask=o_mask)
        lse = tl.where(l_i > 0, m_i + tl.log2(l_safe), float("-inf"))
        tl.store(part_lse_ptr + row, lse, mask=h_mask)


def mla_decode_attention(q: torch.Tensor, cache: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
                         scale: float, kv_lora_rank: int, num_splits: int | None = None,
                         query_start_loc: torch.Tensor | None = None, out: torch.Tensor | None = None,
                         num_warps: int = 4) -> torch.Tensor:
    """MLA of each sequence's single new token over its cached entries; returns [B, H, kv_lora_rank].

    q: [B, H, C] (last-dim stride 1), the absorbed query then the rotated rope part, C = kv_lora_rank + rope;
    cache: [num_blocks, block_size, C] (one layer's kv_cache[0, :, :, 0], the new entries already written);
    block_tables: [B, M]; seq_lens: [B] entries in cache including the new one, which sees all of them. A
    sequence with seq_len 0 gets zeros. Output in q's dtype, softmax in float32. num_splits None:
    default_num_splits from shapes (no host sync either way).

    Mixed step: with query_start_loc ([B + 1]) q is [T, H, C], the step's new tokens; only the rows of
    sequences with exactly one new token are computed, into `out` ([T, H, kv_lora_rank], made when None;
    other rows are left as they are), which is returned.

    num_warps: of the split kernel (4 and num_stages 2, vLLM's for its MLA decode; not measured here). Offline
    at V2-Lite's shape in bf16 (tests/kernels/sm90_compile.py's build, triton 3.9) ptxas gave the 4-warp build
    255 registers and 16-48 bytes of stack, an 8-warp one 165-169 registers and none.
    """
    num_tokens, num_heads, entry_dim = q.shape
    rope_dim = entry_dim - kv_lora_rank
    mixed = query_start_loc is not None
    batch = seq_lens.shape[0] if mixed else num_tokens
    assert q.stride(-1) == 1 and cache.stride(-1) == 1 and cache.shape[-1] == entry_dim and rope_dim > 0
    out = q.new_empty((num_tokens, num_heads, kv_lora_rank)) if out is None else out
    assert out.shape == (num_tokens, num_heads, kv_lora_rank) and out.stride(-1) == 1
    if batch == 0 or num_tokens == 0:
        return out
    block_n = mla_block_n(entry_dim)
    head_blocks = triton.cdiv(num_heads, BLOCK_H)
    if num_splits is None:
        num_splits = default_num_splits(batch, head_blocks, block_tables.shape[1] * cache.shape[1], block_n,
                                        q.device)  # head blocks in the KV heads' place: programs per sequence
    direct = num_splits == 1
    part_out, part_lse = split_buffers(q, out, batch, num_heads, num_splits, kv_lora_rank)
    starts = query_start_loc if mixed else seq_lens  # unread unless mixed
    block_l = max(16, triton.next_power_of_2(kv_lora_rank))
    _mla_decode_split_kernel[(batch, head_blocks, num_splits)](
        q, cache, block_tables, seq_lens, starts, out, part_out, part_lse,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), cache.stride(0), cache.stride(1),
        block_tables.stride(0), scale * LOG2E, num_splits, cache.shape[1], num_heads,
        KV_LORA_RANK=kv_lora_rank, ROPE_DIM=rope_dim, BLOCK_H=BLOCK_H, BLOCK_L=block_l,
        BLOCK_R=max(16, triton.next_power_of_2(rope_dim)), BLOCK_N=block_n, DIRECT=direct, MIXED=mixed,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", num_warps=num_warps, num_stages=2)
    if not direct:
        _decode_reduce_kernel[(batch, num_heads)](
            part_out, part_lse, starts, out, out.stride(0), out.stride(1), num_splits,
            HEAD_DIM=kv_lora_rank, BLOCK_D=block_l, MIXED=mixed,
            num_warps=4)
    return out
