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
def _kv_load(cache_ptr, off, mask, dtype: tl.constexpr, KV_FP8: tl.constexpr):
    """Keys or values at offsets off of a layer's cache, in dtype (the dots' operand type; a float8 cache's
    converted as loaded under FP8_CVT, fp8_convert.py; the conversion is exact: float8 e4m3 fits in float16,
    bfloat16 and float32), masked entries 0."""
    if KV_FP8 == FP8_CVT:
        return fp8_to_f16(tl.load(cache_ptr.to(tl.pointer_type(tl.uint8)) + off, mask=mask, other=0))
    return tl.load(cache_ptr + off, mask=mask, other=0.0).to(dtype)


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
    k = _kv_load(k_cache_ptr, kv_off, kv_mask, q.dtype, KV_FP8)
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
    v = _kv_load(v_cache_ptr, kv_off, kv_mask, q.dtype, KV_FP8)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return acc, l_i, m_new


@triton.jit
def _query_for_dots(q, scale_log2, KV_FP8: tl.constexpr):
    """(q, the scores' scale) as the dots take them. A float8 cache with bfloat16 q: dots in float16 (float8 ->
    float16 is one conversion a pair on sm_90, and a float16 -> bfloat16 one each more, a quarter-rate F2F: 128 of
    the decode loop's 911 instructions; 702 without them). q is scaled first (|q| * scale_log2 within float16's
    range), rounded to float16's finer mantissa; the probabilities p round to float16 for the P.V dot."""
    qk_scale = scale_log2
    if KV_FP8:
        if q.dtype == tl.bfloat16:  # constexpr branches: q may change type
            q = (q.to(tl.float32) * scale_log2).to(tl.float16)
            qk_scale = 1.0
    return q, qk_scale


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
    q, qk_scale = _query_for_dots(q, scale_log2, KV_FP8)
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
                         SOFTCAP: tl.constexpr, HALVES: tl.constexpr = False, FP8_QK: tl.constexpr = False,
                         PV_WGMMA: tl.constexpr = False):
    """rows_attention of one token's query heads of KV head kvh (q: [BLOCK_G, BLOCK_D]) over the keys at
    positions lo..hi-1, all visible. Shared by the decode kernel and the prefill kernel's one-token rows.

    HALVES: each tile's dots over the two halves of the head's dims in turn (q.K as two accumulating dots, P.V into
    two accumulators), so that only half a K or V tile's operand is live at once. At 64-key float8 tiles the
    decode kernel takes 88 registers a thread against 128 under Triton 3.6, the GPU image's (offline sm_90 build
    at the 8B heads, 2026-12-02): five 4-warp programs an SM against four. The same products and sums, up to the
    order of q.K's float32 additions.

    FP8_QK (a float8 cache; not with HALVES): q.K in float8 on the MMA, the keys on its M side (_fp8_qk_attention).
    q is rounded to float8 per head first, so this computes attention of quantize_query_heads(q). PV_WGMMA (with
    FP8_QK): P.V as acc^T = V^T . P, the values on the MMA's M side (_fp8_qk_attention)."""
    if FP8_QK:
        acc, l_i, m_i = _fp8_qk_attention(q, k_cache_ptr, v_cache_ptr, table, kvh, lo, hi, block_size, stride_cb,
                                          stride_co, stride_ch, scale_log2, softcap_log2, BLOCK_G, BLOCK_D, HEAD_DIM,
                                          BLOCK_N, PRECISION, KV_FP8, SOFTCAP, PV_WGMMA)
        return acc * v_scale, l_i, m_i
    if HALVES:
        q, qk_scale = _query_for_dots(q, scale_log2, KV_FP8)
        q_lo, q_hi = tl.split(tl.permute(tl.reshape(q, [BLOCK_G, 2, BLOCK_D // 2]), [0, 2, 1]))
        acc_lo, acc_hi, l_i, m_i = _half_tiles_attention(
            q_lo, q_hi, k_cache_ptr, v_cache_ptr, table, kvh, lo, hi, block_size, stride_cb, stride_co, stride_ch,
            qk_scale, softcap_log2, BLOCK_G, BLOCK_D, HEAD_DIM, BLOCK_N, PRECISION, KV_FP8, SOFTCAP)
        acc = tl.reshape(tl.permute(tl.join(acc_lo, acc_hi), [0, 2, 1]), [BLOCK_G, BLOCK_D])
        if KV_FP8:
            acc = acc * v_scale
        return acc, l_i, m_i
    return rows_attention(q, lo, lo, k_cache_ptr, v_cache_ptr, table, kvh, lo, hi, block_size, stride_cb, stride_co,
                          stride_ch, scale_log2, v_scale, softcap_log2, BLOCK_G, BLOCK_D, HEAD_DIM, BLOCK_N,
                          PRECISION, KV_FP8, SOFTCAP, False)


@triton.jit
def _kv_half(cache_ptr, pages, k_pos, k_valid, kvh, first_d, block_size, stride_cb, stride_co, stride_ch,
             dtype: tl.constexpr, BLOCK_H: tl.constexpr, HEAD_DIM: tl.constexpr, KV_FP8: tl.constexpr):
    """Dims first_d .. first_d + BLOCK_H - 1 of the tile's keys (or values), [BLOCK_N, BLOCK_H] in dtype (a float8
    cache's converted as _kv_tile converts them); keys past hi and dims past HEAD_DIM read as 0."""
    d = first_d + tl.arange(0, BLOCK_H)
    off = (pages * stride_cb + (k_pos % block_size) * stride_co + kvh * stride_ch)[:, None] + d[None, :]
    return _kv_load(cache_ptr, off, k_valid[:, None] & (d < HEAD_DIM)[None, :], dtype, KV_FP8)


@triton.jit
def _half_tiles_attention(q_lo, q_hi, k_cache_ptr, v_cache_ptr, table, kvh, lo, hi, block_size, stride_cb,
                          stride_co, stride_ch, qk_scale, softcap_log2, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
                          HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
                          KV_FP8: tl.constexpr, SOFTCAP: tl.constexpr):
    """one_token_attention's HALVES loop: (acc over the first half of the dims, over the second, l, m), acc
    unnormalised and not yet times v_scale."""
    BLOCK_H: tl.constexpr = BLOCK_D // 2
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc_lo = tl.zeros([BLOCK_G, BLOCK_H], tl.float32)
    acc_hi = tl.zeros([BLOCK_G, BLOCK_H], tl.float32)
    for tile_n in range(lo, hi, BLOCK_N):
        k_pos = tile_n + tl.arange(0, BLOCK_N)
        k_valid = k_pos < hi
        pages = tl.load(table + k_pos // block_size, mask=k_valid, other=0).to(tl.int64)
        k_lo = _kv_half(k_cache_ptr, pages, k_pos, k_valid, kvh, 0, block_size, stride_cb, stride_co, stride_ch,
                        q_lo.dtype, BLOCK_H, HEAD_DIM, KV_FP8)
        k_hi = _kv_half(k_cache_ptr, pages, k_pos, k_valid, kvh, BLOCK_H, block_size, stride_cb, stride_co,
                        stride_ch, q_lo.dtype, BLOCK_H, HEAD_DIM, KV_FP8)
        s = tl.dot(q_lo, tl.trans(k_lo), input_precision=PRECISION)
        s = tl.dot(q_hi, tl.trans(k_hi), s, input_precision=PRECISION) * qk_scale  # [BLOCK_G, BLOCK_N]
        if SOFTCAP:
            s = soft_cap_log2(s, softcap_log2)
        s = tl.where(k_valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # finite: every tile has a valid key
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v_lo = _kv_half(v_cache_ptr, pages, k_pos, k_valid, kvh, 0, block_size, stride_cb, stride_co, stride_ch,
                        q_lo.dtype, BLOCK_H, HEAD_DIM, KV_FP8)
        v_hi = _kv_half(v_cache_ptr, pages, k_pos, k_valid, kvh, BLOCK_H, block_size, stride_cb, stride_co,
                        stride_ch, q_lo.dtype, BLOCK_H, HEAD_DIM, KV_FP8)
        p = p.to(q_lo.dtype)
        acc_lo = acc_lo * alpha[:, None] + tl.dot(p, v_lo, input_precision=PRECISION)
        acc_hi = acc_hi * alpha[:, None] + tl.dot(p, v_hi, input_precision=PRECISION)
        m_i = m_new
    return acc_lo, acc_hi, l_i, m_i


FP8_MAX = tl.constexpr(448.0)  # float8 e4m3fn's largest finite value
FP8_MIN_NORMAL = tl.constexpr(0.015625)  # 2^-6: below it e4m3fn's steps are 2^-9
ROUND_MAGIC = tl.constexpr(12582912.0)  # 1.5 * 2^23: (t + it) - it rounds |t| < 2^22 to an integer, ties to even


@triton.jit
def _round_to_e4m3(y):
    """y (float32, |y| <= 448) rounded to the nearest float8 e4m3fn value, ties to even, still in float32: the
    mantissa cut to 3 bits on the bit pattern (a carry moves into the exponent, as it should), steps of 2^-9 below
    2^-6 (e4m3fn's subnormals). Exact arithmetic, so that Triton's float32 -> float8 cast of the result rounds
    nothing: the interpreter's cast is wrong where rounding carries into the exponent (fp8_matmul.py)."""
    bits = y.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -1048576  # ~0xFFFFF: keep sign, exponent, 3 mantissa bits
    normal = bits.to(tl.float32, bitcast=True)
    t = y * 512.0
    subnormal = ((t + ROUND_MAGIC) - ROUND_MAGIC) * (1.0 / 512.0)
    return tl.where(tl.abs(y) >= FP8_MIN_NORMAL, normal, subnormal)


@triton.jit
def quantize_query_heads(q):
    """(q8, scale [BLOCK_G]): each row (query head) of q [BLOCK_G, BLOCK_D] as float8 e4m3fn times its scale
    max|row| / 448 (1 for a row of zeros): q8 * scale[:, None] is q rounded to float8 per head, the function
    paged_decode_attention_reference's fp8_qk computes with."""
    qf = q.to(tl.float32)
    amax = tl.max(tl.abs(qf), 1)
    scale = tl.where(amax > 0, tl.math.div_rn(amax, tl.full(amax.shape, FP8_MAX, tl.float32)), 1.0)
    y = tl.minimum(tl.maximum(tl.math.div_rn(qf, scale[:, None]), -FP8_MAX), FP8_MAX)
    return _round_to_e4m3(y).to(tl.float8e4nv), scale


@triton.jit
def _fp8_qk_attention(q, k_cache_ptr, v_cache_ptr, table, kvh, lo, hi, block_size, stride_cb, stride_co, stride_ch,
                      scale_log2, softcap_log2, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr,
                      BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, KV_FP8: tl.constexpr, SOFTCAP: tl.constexpr,
                      PV_WGMMA: tl.constexpr = False):
    """one_token_attention's FP8_QK loop: (acc, l, m), acc unnormalised and not yet times v_scale.

    Each tile's scores come transposed, S^T [BLOCK_N, BLOCK_G] = K . q8^T: a float8 key tile straight from the
    pipeline's shared memory on the MMA's M side, against q quantized per head (quantize_query_heads; its
    scales and scale_log2, which holds k_scale, multiply the float32 scores). With 64 or 128 keys a tile, Triton
    builds it as sm_90's float8 wgmma (a 16-row q on the M side would be float16 MMAs over converted tiles). The
    softmax runs over the keys (axis 0); P.V takes P back to [BLOCK_G, BLOCK_N] and the values converted to float16
    (or q's float32), as _kv_tile does. PV_WGMMA: P.V as acc^T [BLOCK_D, BLOCK_G] = V^T . P instead, the converted
    values on the MMA's M side and P as stored (sm_90's wgmma, M = the head's 128 dims; no transpose of P, no
    mma.sync: 331 SASS instructions a 64-key tile against 354, 103 registers against 110, offline build, s32)."""
    q8, q_scale = quantize_query_heads(q)
    q8t = tl.trans(q8)  # [BLOCK_D, BLOCK_G]
    score_scale = q_scale * scale_log2  # [BLOCK_G]
    dot_dtype = tl.float32 if q.dtype == tl.float32 else tl.float16
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_keys = tl.zeros([BLOCK_N, BLOCK_G], tl.float32)  # the softmax's sums, still by key: summed after the loop
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    acc_t = tl.zeros([BLOCK_D, BLOCK_G], tl.float32)  # PV_WGMMA's
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    offs_n = tl.arange(0, BLOCK_N)
    # tiles that start on a page boundary (BLOCK_N a multiple of the page) find a key's place in its page once, out
    # of the loop: the first tile starts at lo rounded down, its keys before lo masked (a window's start)
    ON_PAGES: tl.constexpr = BLOCK_N % block_size == 0
    in_page = ((offs_n % block_size) * stride_co + kvh * stride_ch)[:, None] + offs_d[None, :]
    first = tl.where(lo < hi, lo // BLOCK_N * BLOCK_N, hi) if ON_PAGES else lo  # an empty range stays empty
    for tile_n in range(first, hi, BLOCK_N):
        k_pos = tile_n + offs_n
        k_valid = (k_pos >= lo) & (k_pos < hi)
        pages = tl.load(table + k_pos // block_size, mask=k_valid, other=0).to(tl.int64)
        if ON_PAGES:
            kv_off = (pages * stride_cb)[:, None] + in_page
        else:
            kv_off = (pages * stride_cb + (k_pos % block_size) * stride_co + kvh * stride_ch)[:, None] + offs_d[None, :]
        kv_mask = k_valid[:, None] & d_mask[None, :]
        k = tl.load(k_cache_ptr + kv_off, mask=kv_mask, other=0.0)  # [BLOCK_N, BLOCK_D] float8, as stored
        s = tl.dot(k, q8t) * score_scale[None, :]  # [BLOCK_N, BLOCK_G]
        if SOFTCAP:
            s = soft_cap_log2(s, softcap_log2)
        s = tl.where(k_valid[:, None], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 0))  # finite: every tile has a valid key
        p = tl.exp2(s - m_new[None, :])
        alpha = tl.exp2(m_i - m_new)
        l_keys = l_keys * alpha[None, :] + p
        v = _kv_load(v_cache_ptr, kv_off, kv_mask, dot_dtype, KV_FP8)
        if PV_WGMMA:
            acc_t = acc_t * alpha[None, :] + tl.dot(tl.trans(v), p.to(dot_dtype), input_precision=PRECISION)
        else:
            acc = acc * alpha[:, None] + tl.dot(tl.trans(p).to(dot_dtype), v, input_precision=PRECISION)
        m_i = m_new
    if PV_WGMMA:
        acc = tl.trans(acc_t)
    return acc, tl.sum(l_keys, 0), m_i
