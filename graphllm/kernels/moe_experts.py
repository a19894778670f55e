"""The experts' two grouped GEMMs of the fused MoE (graphllm/kernels/fused_moe.py), with SiLU·mul and the
weighted sum over the k choices fused in, so a decode step runs them as two launches:

    gate_up_silu   act[p]   = silu(x[t] @ Wg[e]^T) * (x[t] @ Wu[e]^T)       [T*k, I]   x's dtype
    down_weighted  term[p]  = (act[p] @ W2[e]^T) * w[p]                     [T*k, H]   x's dtype
                   out[t]   = sum_j term[t*k + j]   (float32, cast once)    [T, H]

for every pair p = t*k + j of token t and its j-th expert e = topk_ids[t, j] with weight w = topk_weights
[t, j]. Program (slot, n) computes BLOCK_N output columns for a group of pairs that chose one expert, so
the expert's [BLOCK_N, K] weight slab is streamed once for all of them. Two row sources:

- scan (decode: few pairs). Slot s owns an expert: expert s when E <= T*k (BY_EXPERT), else the expert of
  pair s if no earlier pair chose it (later slots of that expert return at once). The program loads all
  T*k ids, picks its expert's pairs in pair order BLOCK_M at a time (a one-hot [BLOCK_M, PAIRS] select),
  and loops until all are done, so it needs no alignment step. BLOCK_M == 1 (one token: its k experts
  differ) makes the product a multiply-add over [BLOCK_N, BLOCK_K] weight tiles, no tensor cores: the
  GEMV shape of skinny_matmul's one-row path. down_weighted then adds its pairs' count to the column
  tile's arrival counter (the shared zeroed split-K counters of skinny_matmul); the program that brings
  it to T*k sums every token's k terms of that tile in j order, stores out and resets the counter: the
  same sums in the same order whichever program arrives last, so results are deterministic.
- sorted (prefill). moe_align_block_size's layout: block s is BLOCK_M rows of sorted_ids, all of expert
  expert_ids[s]; blocks past num_padded do nothing. down_weighted stores the terms, and sum_over_k adds
  them (a third launch: one arrival counter per tile would serialise T*k rows on one program).

EARLY (one token under PDL, where the k down slabs fit half the L2: fused_moe.fits_l2; plan's early_down, off
until benchmarks/moe_kernel_bench.py measures it under PDL): gate_up_silu waits for the routing before it lets
down_weighted launch (gdc.released_after_wait), so down_weighted's programs, resident while gate_up streams, read
the routing (from L2) and prefetch their expert's rows of w2 into L2 with evict_last before their own wait;
gate_up's weight loads are evict_first (read once a step), so its stream does not push the prefetched rows out.
Down's ramp from HBM then overlaps gate_up's stream. The results are the same bits either way: only where and
when the weights are fetched changes.

float8 experts (graphllm.fused_moe_fp8): w is float8_e4m3fn with a float32 scale per output row (scale_ptr,
[E, 2I] and [E, H]); weight-only, so the activations stay in x's dtype. A weight tile widens to x's dtype in
registers (exact) before the product, and each output column's float32 sum is multiplied by its row's scale
(exact per-channel dequantization), before the projection's rounding. Which weights take this path is read
from w's element type at compile time: float weights compile to the code they had before (scale_ptr None).

Rounding follows the reference (fused_moe_reference.reference_fused_experts) step by step: each
projection rounded to x's dtype, silu(gate) rounded before the product with up, the weighted term rounded,
the k terms summed in float32. Accumulation is float32; float32 operands use IEEE dots (no TF32). On CPU
(only the Triton interpreter runs those, for tests) dots run in float32: NumPy has no bfloat16 matmul.
"""

import triton
import triton.language as tl

from graphllm.kernels.gdc import dependent_start, prefetch_l2_kept, released_after_wait, weight_lines


@triton.jit
def _scan_slot(ids_ptr, slot, num_pairs, BY_EXPERT: tl.constexpr, PAIRS: tl.constexpr, CACHE: tl.constexpr):
    """Slot's expert, its pairs ([PAIRS] bool, in pair order) and their count (0: another slot owns them)."""
    offs = tl.arange(0, PAIRS)
    ids = tl.load(ids_ptr + offs, mask=offs < num_pairs, other=-1, cache_modifier=CACHE)  # [PAIRS]
    if BY_EXPERT:
        expert = slot
    else:
        expert = tl.load(ids_ptr + slot, cache_modifier=CACHE)
    match = ids == expert
    count = tl.sum(match.to(tl.int32), axis=0)
    if not BY_EXPERT:
        first = tl.min(tl.where(match, offs, PAIRS), axis=0)
        count = tl.where(first == slot, count, 0)
    return expert, match, count


@triton.jit
def _slot_plan(ids_ptr, sorted_ids_ptr, expert_ids_ptr, num_padded_ptr, slot, num_pairs, SORTED: tl.constexpr,
               BY_EXPERT: tl.constexpr, PAIRS: tl.constexpr, BLOCK_M: tl.constexpr):
    """(expert, match, rank, count, chunks): what program slot computes; match/rank feed _chunk_rows."""
    if SORTED:
        expert = tl.load(expert_ids_ptr + slot)
        count = tl.where(slot * BLOCK_M < tl.load(num_padded_ptr), BLOCK_M, 0)  # idle blocks: no chunk
        rank = tl.zeros([PAIRS], dtype=tl.int32)  # unused: sorted_ids names the rows
        match = rank > 0
    else:
        expert, match, count = _scan_slot(ids_ptr, slot, num_pairs, BY_EXPERT, PAIRS, "")
        rank = tl.cumsum(match.to(tl.int32), axis=0) - 1  # [PAIRS] rank of each pair within the expert
    return expert, match, rank, count, tl.cdiv(count, BLOCK_M)


@triton.jit
def _chunk_rows(sorted_ids_ptr, match, rank, slot, chunk, num_pairs, SORTED: tl.constexpr, PAIRS: tl.constexpr,
                BLOCK_M: tl.constexpr):
    """The chunk's pairs [BLOCK_M] (int32) and which of them are real [BLOCK_M]."""
    if SORTED:
        pairs = tl.load(sorted_ids_ptr + slot * BLOCK_M + tl.arange(0, BLOCK_M))
        valid = pairs < num_pairs
    else:
        want = chunk * BLOCK_M + tl.arange(0, BLOCK_M)
        hit = match[None, :] & (rank[None, :] == want[:, None])  # [BLOCK_M, PAIRS]
        pairs = tl.sum(tl.where(hit, tl.arange(0, PAIRS)[None, :], 0), axis=1)
        valid = tl.max(hit.to(tl.int32), axis=1) > 0
    return pairs, valid


@triton.jit
def _accumulate(acc, a, w, BLOCK_M: tl.constexpr, DOT_FP32: tl.constexpr, PRECISION: tl.constexpr):
    """acc += a [BLOCK_M, BLOCK_K] @ w [BLOCK_N, BLOCK_K]^T; one row: acc [BLOCK_N, BLOCK_K] += w * a."""
    if BLOCK_M == 1:
        acc += w.to(tl.float32) * a.to(tl.float32)
    elif DOT_FP32:
        acc = tl.dot(a.to(tl.float32), tl.trans(w.to(tl.float32)), acc, input_precision="ieee")
    else:  # float8 weights widen to a's dtype here, in registers (exact); a's dtype: no conversion
        acc = tl.dot(a, tl.trans(w.to(a.dtype)), acc, input_precision=PRECISION)
    return acc


@triton.jit
def _project(a_rows, valid, w1_rows, w2_rows, scale_ptr, s1_rows, s2_rows, n_mask, K, stride_wk,
             TWO: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
             DOT_FP32: tl.constexpr, PRECISION: tl.constexpr, W_EVICT: tl.constexpr):
    """a[rows, :K] @ w1[slab, :K]^T (and w2's when TWO): [BLOCK_M, BLOCK_N] float32 each.
    a_rows [BLOCK_M, 1] and w*_rows [BLOCK_N, 1] point at the rows' first columns. Float8 weights: each
    column is then scaled by its weight row's scale, scale_ptr[s*_rows] (s*_rows [BLOCK_N]; other weights
    read no scale, and scale_ptr may be None)."""
    offs_k = tl.arange(0, BLOCK_K)
    if BLOCK_M == 1:
        acc1 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    else:
        acc1 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc2 = acc1
    for k0 in range(0, K, BLOCK_K):
        k = k0 + offs_k
        in_k = (k < K)[None, :]
        a = tl.load(a_rows + k[None, :], mask=valid[:, None] & in_k, other=0.0)  # [BLOCK_M, BLOCK_K]
        w_mask = n_mask[:, None] & in_k
        w1 = tl.load(w1_rows + k[None, :] * stride_wk, mask=w_mask, other=0.0, eviction_policy=W_EVICT)
        acc1 = _accumulate(acc1, a, w1, BLOCK_M, DOT_FP32, PRECISION)
        if TWO:
            w2 = tl.load(w2_rows + k[None, :] * stride_wk, mask=w_mask, other=0.0, eviction_policy=W_EVICT)
            acc2 = _accumulate(acc2, a, w2, BLOCK_M, DOT_FP32, PRECISION)
    if BLOCK_M == 1:
        acc1 = tl.sum(acc1, axis=1)[None, :]  # [1, BLOCK_N]
        acc2 = tl.sum(acc2, axis=1)[None, :]
    if w1_rows.dtype.element_ty.is_fp8():  # per output channel: exact dequantization of the product
        acc1 = acc1 * tl.load(scale_ptr + s1_rows, mask=n_mask, other=0.0)[None, :]
        if TWO:
            acc2 = acc2 * tl.load(scale_ptr + s2_rows, mask=n_mask, other=0.0)[None, :]
    return acc1, acc2


@triton.jit
def _gate_up_silu_kernel(x_ptr, w_ptr, scale_ptr, act_ptr, ids_ptr, sorted_ids_ptr, expert_ids_ptr, num_padded_ptr,
                         num_pairs, size, hidden, stride_xt, stride_we, stride_wn, stride_wk,
                         SORTED: tl.constexpr, BY_EXPERT: tl.constexpr, PAIRS: tl.constexpr, TOP_K: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         DOT_FP32: tl.constexpr, PRECISION: tl.constexpr, EARLY: tl.constexpr = False,
                         PDL: tl.constexpr = False):
    if PDL:  # launched as a programmatic dependent (launch.py): nothing is read before the kernels before are done
        if EARLY:  # and down_weighted launches only then: the routing it reads early is complete
            released_after_wait()
        else:
            dependent_start()
    slot = tl.program_id(0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < size
    expert, match, rank, count, chunks = _slot_plan(ids_ptr, sorted_ids_ptr, expert_ids_ptr, num_padded_ptr, slot,
                                                    num_pairs, SORTED, BY_EXPERT, PAIRS, BLOCK_M)
    gate_rows = w_ptr + expert.to(tl.int64) * stride_we + offs_n.to(tl.int64)[:, None] * stride_wn  # [BLOCK_N, 1]
    up_rows = gate_rows + size * stride_wn
    gate_scales = expert.to(tl.int64) * 2 * size + offs_n  # [BLOCK_N] rows of scale [E, 2I] (float8 w)
    for chunk in range(chunks):
        pairs, valid = _chunk_rows(sorted_ids_ptr, match, rank, slot, chunk, num_pairs, SORTED, PAIRS, BLOCK_M)
        x_rows = x_ptr + (pairs // TOP_K).to(tl.int64)[:, None] * stride_xt  # [BLOCK_M, 1]
        gate, up = _project(x_rows, valid, gate_rows, up_rows, scale_ptr, gate_scales, gate_scales + size, n_mask,
                            hidden, stride_wk, True, BLOCK_M, BLOCK_N, BLOCK_K, DOT_FP32, PRECISION,
                            "evict_first" if EARLY else "")  # read once: the down slabs fetched early stay
        gate = gate.to(act_ptr.dtype.element_ty).to(tl.float32)  # the projection's rounding
        silu = (gate / (1.0 + tl.exp(-gate))).to(act_ptr.dtype.element_ty).to(tl.float32)  # F.silu's
        act = silu * up.to(act_ptr.dtype.element_ty).to(tl.float32)
        tl.store(act_ptr + pairs.to(tl.int64)[:, None] * size + offs_n[None, :], act.to(act_ptr.dtype.element_ty),
                 mask=valid[:, None] & n_mask[None, :])


@triton.jit
def _sum_terms(terms_ptr, out_ptr, tokens, offs_n, n_mask, num_tokens, hidden, stride_ot, TOP_K: tl.constexpr,
               BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, CACHE: tl.constexpr):
    """out[tokens, offs_n] = the sum over j of terms[token * TOP_K + j], in float32 and in j order."""
    mask = (tokens < num_tokens)[:, None] & n_mask[None, :]
    first = tokens.to(tl.int64) * TOP_K
    total = tl.zeros([BLOCK_T, BLOCK_N], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        total += tl.load(terms_ptr + (first + j)[:, None] * hidden + offs_n[None, :], mask=mask, other=0.0,
                         cache_modifier=CACHE).to(tl.float32)
    tl.store(out_ptr + tokens.to(tl.int64)[:, None] * stride_ot + offs_n[None, :],
             total.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _prefetch_slab(w_ptr, offs_n, rows, size, stride_wn, count, BLOCK_K: tl.constexpr):
    """prefetch.global.L2::evict_last of rows offs_n of an expert's [rows, size] weight (unit K stride), if count > 0."""
    if count > 0:
        for k0 in range(0, size, BLOCK_K):
            prefetch_l2_kept(weight_lines(w_ptr, offs_n, rows, k0, stride_wn, BLOCK_K))


@triton.jit
def _down_weighted_kernel(act_ptr, w_ptr, scale_ptr, weights_ptr, terms_ptr, out_ptr, counters_ptr, ids_ptr,
                          sorted_ids_ptr, expert_ids_ptr, num_padded_ptr, num_pairs, num_tokens, hidden, size,
                          stride_we, stride_wn, stride_wk, stride_ot, SORTED: tl.constexpr, BY_EXPERT: tl.constexpr,
                          PAIRS: tl.constexpr, TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_K: tl.constexpr, BLOCK_T: tl.constexpr, DOT_FP32: tl.constexpr,
                          PRECISION: tl.constexpr, EARLY: tl.constexpr = False, PDL: tl.constexpr = False):
    slot = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < hidden
    if PDL:  # launched as a programmatic dependent (launch.py)
        if SORTED or not EARLY:  # nothing is read before the kernels before are done
            dependent_start()
        else:  # gate_up_silu released this launch after its own wait: the routing is complete, and the chosen
            # experts' slabs are fetched into L2 while gate_up streams (ids read from L2: .cg)
            early, early_pairs, early_count = _scan_slot(ids_ptr, slot, num_pairs, BY_EXPERT, PAIRS, ".cg")
            _prefetch_slab(w_ptr + early.to(tl.int64) * stride_we, offs_n, hidden, size, stride_wn, early_count,
                           BLOCK_K)
            dependent_start()
    expert, match, rank, count, chunks = _slot_plan(ids_ptr, sorted_ids_ptr, expert_ids_ptr, num_padded_ptr, slot,
                                                    num_pairs, SORTED, BY_EXPERT, PAIRS, BLOCK_M)
    w_rows = w_ptr + expert.to(tl.int64) * stride_we + offs_n.to(tl.int64)[:, None] * stride_wn  # [BLOCK_N, 1]
    scales = expert.to(tl.int64) * hidden + offs_n  # [BLOCK_N] rows of scale [E, H] (float8 w)
    for chunk in range(chunks):
        pairs, valid = _chunk_rows(sorted_ids_ptr, match, rank, slot, chunk, num_pairs, SORTED, PAIRS, BLOCK_M)
        act_rows = act_ptr + pairs.to(tl.int64)[:, None] * size  # [BLOCK_M, 1]
        y, _ = _project(act_rows, valid, w_rows, w_rows, scale_ptr, scales, scales, n_mask, size, stride_wk, False,
                        BLOCK_M, BLOCK_N, BLOCK_K, DOT_FP32, PRECISION, "")
        weight = tl.load(weights_ptr + pairs, mask=valid, other=0.0)  # [BLOCK_M] float32
        term = y.to(terms_ptr.dtype.element_ty).to(tl.float32) * weight[:, None]
        tl.store(terms_ptr + pairs.to(tl.int64)[:, None] * hidden + offs_n[None, :],
                 term.to(terms_ptr.dtype.element_ty), mask=valid[:, None] & n_mask[None, :])
    if not SORTED:
        if count > 0:
            tl.debug_barrier()  # every thread's terms are stored before the count is released
            arrived = tl.atomic_add(counters_ptr + pid_n, count, sem="acq_rel")
            if arrived + count == num_pairs:  # the tile's last pairs: sum every token's terms
                for t0 in range(0, num_tokens, BLOCK_T):
                    _sum_terms(terms_ptr, out_ptr, t0 + tl.arange(0, BLOCK_T), offs_n, n_mask, num_tokens, hidden,
                               stride_ot, TOP_K, BLOCK_T, BLOCK_N, ".cg")
                tl.atomic_xchg(counters_ptr + pid_n, 0)


@triton.jit
def _sum_over_k_kernel(terms_ptr, out_ptr, num_tokens, hidden, stride_ot, TOP_K: tl.constexpr,
                       BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr = False):
    if PDL:  # launched as a programmatic dependent (launch.py): nothing is read before the kernels before are done
        dependent_start()
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    _sum_terms(terms_ptr, out_ptr, tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T), offs_n, offs_n < hidden,
               num_tokens, hidden, stride_ot, TOP_K, BLOCK_T, BLOCK_N, "")
