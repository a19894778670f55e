"""The key loop every paged attention kernel runs: an online softmax over KV tiles gathered from the pages.

`rows_attention` takes a block of query rows of one KV head over the keys lo..hi-1, causal per row (the
prefill and verify kernels) or with every key visible (`one_token_attention`: one token's query heads, the
decode kernel and the prefill kernel's one-token rows); `_kv_tile` is one tile of it. A float8 cache's tiles
convert to q's dtype for the dots (fp8_convert.py); Gemma 2's logit soft cap is `soft_cap_log2`, in the
kernels' log2 domain.
"""

import triton
import triton.language as tl

from graphllm.kernels.fp8_convert import FP8_CVT, fp8_to_f16


@triton.jit
def soft_cap_log2(s, softcap_log2):
    """softcap_log2 * tanh(s / softcap_log2), tanh(x) = 1 - 2 / (exp(2x) + 1): Triton has no tanh in
    every version (nor in the interpreter); exp2 of a large x is inf and gives 1, of a small one 0 and -1."""
    return softcap_log2 * (1.0 - 2.0 / (tl.exp2(s / softcap_log2 * (2.0 * 1.4426950408889634)) + 1.0))


@triton.jit
def _kv_tile(acc, l_i, m_i, q, q_pos, q_min_key, tile_n, hi, k_cache_ptr, v_cache_ptr, table, kvh, block_size,
             stride_cb, stride_co, stride_ch, qk_scale, softcap_log2, BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr,
             BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, KV_FP8: tl.constexpr, SOFTCAP: tl.constexpr,
             CAUSAL: tl.constexpr, MASKED: tl.constexpr):
    """One KV tile (keys tile_n .. tile_n + BLOCK_N - 1) of rows_attention's online softmax; returns the new
    (acc, l, m). MASKED False: every row sees every key of the tile (the caller proved it), so no key is masked."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    k_pos = tile_n + offs_n  # [BLOCK_N] key positions
    k_valid = k_pos < hi
    # block_size is a constexpr of every kernel that calls this: shifts and masks, not integer divisions (the
    # sm_90 loop of a decode split program: 437 SASS instructions a KV tile against 514 with a runtime
    # block_size; benchmarks/attention_sass.py --runtime-hints)
    if MASKED:
        pages = tl.load(table + k_pos // block_size, mask=k_valid, other=0).to(tl.int64)
    else:
        pages = tl.load(table + k_pos // block_size).to(tl.int64)
    kv_off = (pages * stride_cb + (k_pos % block_size) * stride_co + kvh * stride_ch)[:, None] \
        + offs_d[None, :]  # [BLOCK_N, BLOCK_D]
    if MASKED:
        kv_mask = k_valid[:, None] & d_mask[None, :]
    else:
        kv_mask = d_mask[None, :]
    if KV_FP8 == FP8_CVT:  # converted as loaded (fp8_convert.py)
        k = fp8_to_f16(tl.load(k_cache_ptr.to(tl.pointer_type(tl.uint8)) + kv_off, mask=kv_mask, other=0))
    else:
        k = tl.load(k_cache_ptr + kv_off, mask=kv_mask, other=0.0).to(q.dtype)
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # [BLOCK_M, BLOCK_N]
    if SOFTCAP:
        s = soft_cap_log2(s, softcap_log2)
    if not MASKED:
        m_new = tl.maximum(m_i, tl.max(s, 1))  # finite: every row sees the whole tile
        m_safe = m_new
    elif CAUSAL:
        visible = k_valid[None, :] & (k_pos[None, :] <= q_pos[:, None]) & (k_pos[None, :] >= q_min_key[:, None])
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new > float("-inf"), m_new, 0.0)  # a row may see nothing yet
    else:
        s = tl.where(k_valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # finite: every tile has a valid key
        m_safe = m_new
    p = tl.exp2(s - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    if KV_FP8 == FP8_CVT:
        v = fp8_to_f16(tl.load(v_cache_ptr.to(tl.pointer_type(tl.uint8)) + kv_off, mask=kv_mask, other=0))
    else:
        v = tl.load(v_cache_ptr + kv_off, mask=kv_mask, other=0.0)
        if KV_FP8:  # exact: float8 e4m3 fits in float16, bfloat16 and float32
            v = v.to(q.dtype)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return acc, l_i, m_new


@triton.jit
def rows_attention(q, q_pos, q_min_key, k_cache_ptr, v_cache_ptr, table, kvh, lo, hi, block_size,
                   stride_cb, stride_co, stride_ch, scale_log2, v_scale, softcap_log2, BLOCK_M: tl.constexpr,
                   BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
                   KV_FP8: tl.constexpr, SOFTCAP: tl.constexpr, CAUSAL: tl.constexpr = True,
                   WINDOWED: tl.constexpr = False):
    """Online softmax of q's rows ([BLOCK_M, BLOCK_D], queries of KV head kvh) over the keys at positions
    lo..hi-1 of the pages in `table`; returns (acc, l, m), acc unnormalised. CAUSAL: row r sees keys
    q_min_key[r]..q_pos[r] only, and a row that sees no key gets l = 0 (the prefill kernel, verify
    attention); else every row sees every key in range (one token's query heads: q_pos, q_min_key unread).
    KV_FP8: a float8 cache (fp8_convert.kv_fp8_mode: FP8_CVT converts each tile as it is loaded, and needs float16
    or bfloat16 q), whose k_scale the caller folded into scale_log2; acc comes back times v_scale.
    SOFTCAP: soft-cap the scores (soft_cap_log2) before the mask.

    CAUSAL: the tiles every row sees whole (from the latest first key of any row, WINDOWED, to the earliest last
    one, below hi) run without masks, in a loop of their own; the tiles before them (a window's start) and after
    them (the causal diagonal, a partial last tile) with masks. Rows the caller will not store may only narrow
    that range, never widen it. (The prefill kernel's unmasked loop is 504 sm_90 instructions a tile, its
    masked one 761, the single loop before them 767; the decode kernel keeps its one loop: its tiles are all
    whole but the last, and its masks cost less, 372 against 435.)"""
    qk_scale = scale_log2
    if KV_FP8:
        if q.dtype == tl.bfloat16:  # dots in float16: float8 -> float16 is one conversion a pair on sm_90, and a
            # float16 -> bfloat16 one each more (a quarter-rate F2F: 128 of the decode loop's 911 instructions; 702
            # without them). q is scaled first (|q| * scale_log2 within float16's range), rounded to float16's finer
            # mantissa; the probabilities p round to float16 for the P.V dot
            q = (q.to(tl.float32) * scale_log2).to(tl.float16)
            qk_scale = 1.0
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    if CAUSAL:
        full_lo = lo  # keys every row sees: full_lo .. full_hi - 1
        if WINDOWED:
            full_lo = tl.maximum(tl.max(q_min_key, 0), lo)
        full_hi = tl.minimum(tl.min(q_pos, 0) + 1, hi)
        first = lo + tl.cdiv(tl.maximum(full_lo - lo, 0), BLOCK_N) * BLOCK_N  # the unmasked tiles: first .. last
        last = tl.maximum(lo + tl.maximum(full_hi - lo, 0) // BLOCK_N * BLOCK_N, first)
        if WINDOWED:
            for tile_n in range(lo, tl.minimum(first, hi), BLOCK_N):
                acc, l_i, m_i = _kv_tile(acc, l_i, m_i, q, q_pos, q_min_key, tile_n, hi, k_cache_ptr, v_cache_ptr,
                                         table, kvh, block_size, stride_cb, stride_co, stride_ch, qk_scale,
                                         softcap_log2, BLOCK_D, HEAD_DIM, BLOCK_N, PRECISION, KV_FP8, SOFTCAP, CAUSAL,
                                         True)
        for tile_n in range(first, last, BLOCK_N):
            acc, l_i, m_i = _kv_tile(acc, l_i, m_i, q, q_pos, q_min_key, tile_n, hi, k_cache_ptr, v_cache_ptr, table,
                                     kvh, block_size, stride_cb, stride_co, stride_ch, qk_scale, softcap_log2, BLOCK_D,
                                     HEAD_DIM, BLOCK_N, PRECISION, KV_FP8, SOFTCAP, CAUSAL, False)
        lo = last
    for tile_n in range(lo, hi, BLOCK_N):  # CAUSAL: the tiles after the unmasked ones
        acc, l_i, m_i = _kv_tile(acc, l_i, m_i, q, q_pos, q_min_key, tile_n, hi, k_cache_ptr, v_cache_ptr, table,
                                 kvh, block_size, stride_cb, stride_co, stride_ch, qk_scale, softcap_log2, BLOCK_D,
                                 HEAD_DIM, BLOCK_N, PRECISION, KV_FP8, SOFTCAP, CAUSAL, True)
    if KV_FP8:
        acc = acc * v_scale
    return acc, l_i, m_i


@triton.jit
def one_token_attention(q, k_cache_ptr, v_cache_ptr, table, kvh, lo, hi, block_size,
                         stride_cb, stride_co, stride_ch, scale_log2, v_scale, softcap_log2,
                         BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr,
                         BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, KV_FP8: tl.constexpr,
                         SOFTCAP: tl.constexpr):
    """rows_attention of one token's query heads of KV head kvh (q: [BLOCK_G, BLOCK_D]) over the keys at
    positions lo..hi-1, all visible. Shared by the decode kernel and the prefill kernel's one-token rows."""
    return rows_attention(q, lo, lo, k_cache_ptr, v_cache_ptr, table, kvh, lo, hi, block_size, stride_cb, stride_co,
                          stride_ch, scale_log2, v_scale, softcap_log2, BLOCK_G, BLOCK_D, HEAD_DIM, BLOCK_N,
                          PRECISION, KV_FP8, SOFTCAP, False)
