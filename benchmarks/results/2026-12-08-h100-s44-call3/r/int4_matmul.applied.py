"""y = x @ W^T (+ bias) for a weight-only int4 linear (GPTQ packing), W dequantized in registers: one Triton kernel.

    x [M, K] float16 / bfloat16 / float32 (last-dim stride 1), qweight int32 [K/8, N], scales [K/G, N],
    zeros [K/G, N] (all contiguous; zeros whole numbers 0..15), bias [N] or None  ->  y [M, N] in x's dtype
    W[n, k] = (q[k, n] - zeros[k // G, n]) * scales[k // G, n],  q[8r + j, n] = nibble j of qweight[r, n]
    (quant_layout; int4_linear_reference is the oracle)

The weight is streamed once whatever M is (Marlin's idea): grid (tiles_m * tiles_n, SPLIT_K), and at
decode sizes one 16-row dot tile serves 1..16 rows, so the time is flat in M up to 16. A K step loads
words [BLOCK_K/8, BLOCK_N] once (coalesced along N, 16-byte loads where BLOCK_N allows) and every thread
unpacks the words it holds into a nibble tile [BLOCK_K/8, 8, BLOCK_N] ([r, j] is W's row 8r + j, so the
row-major reshape to [BLOCK_K, BLOCK_N] is K order and x is read contiguously):

    BLOCK_M == 1:   acc[BLOCK_K/8, 8, BLOCK_N] += W * x           (float32 multiply-add), one sum at the end
      ROW_SUM:      acc[BLOCK_K/8, BLOCK_N] += s * sum_j (q - z) x   (a word's 8 products summed in its thread,
                                                                   then its row's scale: fewer registers and ops)
    BLOCK_M >= 16:  acc[BLOCK_M, BLOCK_N] += x @ W                (ONE tl.dot per K step, BLOCK_K >= 32)
      SWAP_AB:      acc[BLOCK_N, BLOCK_M] += W^T @ x^T            (the weight on the MMA's M side)

The previous design did 8 dots per step, each BLOCK_K/8 deep, on 8 strided slices of x. Per weight
element the work is now a shift and a mask-or (q | 0x4B000000 read as float32 is 2^23 + q: no quarter-rate
I2F), then in 16 bits q | 0x4300 read as bfloat16 is 128 + q (0x6400: float16 1024 + q), and one 16-bit
subtraction of 128 + z leaves q - z exactly, with no float32 round trip or F2F conversion. Scales and zeros
are loaded once per K step as [1, BLOCK_N] where the step lies in one group (ONE_GROUP: G % BLOCK_K == 0,
e.g. G = 128 with BLOCK_K 32..128), else per word row (a word's 8 rows share a group).

The K loop names its num_stages (tl.range): Triton software-pipelines a loop whose loads feed no dot only
when told, and the one-row path streamed at ~1 TB/s without it (run 12 against the sweep before: 1.1-1.6x
faster per shape with it and ROW_SUM).

One row in packed float16 (_int4_gemv_kernel with config F16; s42's H100 sweep took it for gate_up and the
int4 lm_head, 3.5-4% faster there, and the float32 GEMV for the narrower shapes): word rows
in pairs, each pair's 16 x values scaled by one power of two into [-2, 2) and packed as float16 pairs; per word one
shift and four LOP3 with 0x6400 make four float16 pairs 1024 + q (or 1024 + 16 q), two subtractions and two
multiply-adds make q - 8 exactly, and four packed multiply-adds sum x' (q - 8) (_word_pair_dot16); the zero point
enters as (8 - z) sum(x) in float32. Offline sm_90 SASS (benchmarks/int4_gemv_sass.py, the launcher's divisibility
hints): 2.83 instructions a weight in 4 column parts (F16 4, 256 x 128 tiles) against the float32 GEMV's 3.99, since
both find a step's group by a shift (GROUP_SHIFT, G a power of two) and load whole column tiles without masks
(EVEN_N); with a division and masks they took 2.99 and 4.30. Its float16 roundings (x' once, each product and lane sum once)
are within 2^-7 of sum |x| |q - 8| s. Triton's interpreter runs the same operations on float16 tensors.

No prologue: s40 built the norms and SwiGLU into the one-row GEMV (every program reading the row's mean square,
each x value the prologue's output) and removed it in s42 unmeasured: its sm_90 K loop, built with the launcher's
divisibility hints, was 1.4-1.5x the plain loop's instructions with SwiGLU and 3.8-5.5x with add + RMSNorm
(spilling), against the ~2-3 us each of the kernels it would have saved (benchmarks/RESULTS.md, s41).

Rows past 16 (prefill) take GEMM tiles of the same kernel (BLOCK_M 32..128, GROUP_M row tiles grouped,
no K split): the weight is dequantized per tile in registers. SPLIT_K > 1 reduces as skinny_matmul does
(finish_tile), deterministically. benchmarks/quant_kernel_sweep.py times the configs beside bf16 cuBLAS
and tinygemm.

Where it rounds:
- one row: W = (q - z) * s in float32 (exact for a 16-bit scale: a 5-bit integer times it), products and
  sums in float32: the reference up to float32 rounding.
- dot tiles, ONE_GROUP: (q - z) is exact in x's dtype; the dot sums x * (q - z) in float32 and the
  group's scale multiplies each step's sum: again the reference up to float32 rounding.
- dot tiles, a K step spanning groups (G < BLOCK_K): W = (q - z) * s rounded once to x's dtype (relative
  2^-8 in bfloat16, 2^-11 in float16) before the dot, as a dequantize-then-cuBLAS path would (weight_rounds).
Then + bias and one rounding to x's dtype.
"""

import torch
import triton
import triton.language as tl

from graphllm.kernels.gdc import dependent_start
from graphllm.kernels.int8_matmul import (MAX_ROWS, dot_precision, m_bucket, plan_launch, sm_count, tile_ids,
                                          tile_shape)
from graphllm.kernels.launch import pdl_launch
from graphllm.kernels.quant_layout import INT4_PACK, check_int4_shape, int4_linear_reference  # noqa: F401
from graphllm.kernels.skinny_matmul import SUMSQ_GROUP, _sumsq_rstd, finish_tile

# (m_bucket, N, K) -> config: the best of benchmarks/quant_kernel_sweep.py on the H200, 2026-11-25 (4 and 16 rows:
# the nibble-pair sweep of the twelfth session, qsweep-pairs); one row: the GEMV sweep of 2026-12-08 on an H100
# (qsweep-int4, s42: packed float16 for gate_up and lm_head, the float32 GEMV elsewhere)
# (Llama-3-8B shapes, G = 128), up to 16 rows (past that graphllm.int4_linear dequantizes for cuBLAS)
CONFIGS: dict[tuple[int, int, int], dict] = {
    (1, 4096, 4096): {'BLOCK_M': 1, 'BLOCK_N': 128, 'BLOCK_K': 128, 'num_warps': 4, 'GEMV': True, 'num_stages': 1, 'PREFETCH': False, 'SPLIT_K': 16},
    (2, 4096, 4096): {'BLOCK_M': 16, 'BLOCK_N': 64, 'BLOCK_K': 256, 'num_warps': 4, 'num_stages': 3, 'SWAP_AB': True, 'SPLIT_K': 4},  # rounds W to bf16
    (4, 4096, 4096): {'BLOCK_M': 16, 'BLOCK_N': 64, 'BLOCK_K': 256, 'num_warps': 4, 'num_stages': 3, 'SWAP_AB': True, 'SPLIT_K': 4},  # rounds W to bf16
    (8, 4096, 4096): {'BLOCK_M': 16, 'BLOCK_N': 64, 'BLOCK_K': 128, 'num_warps': 4, 'num_stages': 4, 'SWAP_AB': False, 'SPLIT_K': 8},
    (16, 4096, 4096): {'BLOCK_M': 16, 'BLOCK_N': 64, 'BLOCK_K': 128, 'num_warps': 4, 'num_stages': 4, 'PAIRS': 1, 'SWAP_AB': True, 'SPLIT_K': 4},
    (1, 4096, 14336): {'BLOCK_M': 1, 'BLOCK_N': 128, 'BLOCK_K': 128, 'num_warps': 4, 'GEMV': True, 'num_stages': 1, 'PREFETCH': True, 'SPLIT_K': 16},
    (2, 4096, 14336): {'BLOCK_M': 16, 'BLOCK_N': 128, 'BLOCK_K': 128, 'num_warps': 4, 'num_stages': 4, 'SWAP_AB': False, 'SPLIT_K': 8},
    (4, 4096, 14336): {'BLOCK_M': 16, 'BLOCK_N': 128, 'BLOCK_K': 128, 'num_warps': 4, 'num_stages': 4, 'SWAP_AB': False, 'SPLIT_K': 8},
    (8, 4096, 14336): {'BLOCK_M': 16, 'BLOCK_N': 128, 'BLOCK_K': 128, 'num_warps': 4, 'num_stages': 4, 'SWAP_AB': False, 'SPLIT_K': 8},
    (16, 4096, 14336): {'BLOCK_M': 16, 'BLOCK_N': 128, 'BLOCK_K': 128, 'num_warps': 4, 'num_stages': 4, 'SWAP_AB': False, 'SPLIT_K': 8},
    (1, 6144, 4096): {'BLOCK_M': 1, 'BLOCK_N': 128, 'BLOCK_K': 128, 'num_warps': 2, 'GEMV': True, 'num_stages': 1, 'PREFETCH': False, 'SPLIT_K': 16},
    (4, 6144, 4096): {'BLOCK_M': 16, 'BLOCK_N': 128, 'BLOCK_K': 128, 'num_warps': 4, 'num_stages': 4, 'PAIRS': 2, 'SWAP_AB': False, 'SPLIT_K': 8},
    (16, 6144, 4096): {'BLOCK_M': 16, 'BLOCK_N': 64, 'BLOCK_K': 128, 'num_warps': 4, 'num_stages': 4, 'PAIRS': 1, 'SWAP_AB': True, 'SPLIT_K': 4},
    (1, 28672, 4096): {'BLOCK_M': 1, 'BLOCK_N': 128, 'BLOCK_K': 128, 'num_warps': 4, 'GEMV': True, 'F16': 2, 'num_stages': 1, 'SPLIT_K': 4},
    (2, 28672, 4096): {'BLOCK_M': 16, 'BLOCK_N': 128, 'BLOCK_K': 64, 'num_warps': 4, 'num_stages': 5, 'SWAP_AB': False, 'SPLIT_K': 4},
    (4, 28672, 4096): {'BLOCK_M': 16, 'BLOCK_N': 256, 'BLOCK_K': 128, 'num_warps': 8, 'num_stages': 3, 'PAIRS': 2, 'SWAP_AB': False, 'SPLIT_K': 2},
    (8, 28672, 4096): {'BLOCK_M': 16, 'BLOCK_N': 128, 'BLOCK_K': 64, 'num_warps': 4, 'num_stages': 5, 'SWAP_AB': False, 'SPLIT_K': 4},
    (16, 28672, 4096): {'BLOCK_M': 16, 'BLOCK_N': 128, 'BLOCK_K': 64, 'num_warps': 4, 'num_stages': 5, 'SWAP_AB': False, 'SPLIT_K': 4},
    (1, 128256, 4096): {'BLOCK_M': 1, 'BLOCK_N': 256, 'BLOCK_K': 128, 'num_warps': 4, 'GEMV': True, 'F16': 4, 'num_stages': 2, 'SPLIT_K': 4},
    (2, 128256, 4096): {'BLOCK_M': 16, 'BLOCK_N': 128, 'BLOCK_K': 64, 'num_warps': 4, 'num_stages': 5, 'SWAP_AB': True, 'SPLIT_K': 4},
    (4, 128256, 4096): {'BLOCK_M': 16, 'BLOCK_N': 256, 'BLOCK_K': 128, 'num_warps': 8, 'num_stages': 3, 'PAIRS': 2, 'SWAP_AB': False, 'SPLIT_K': 1},
    (8, 128256, 4096): {'BLOCK_M': 16, 'BLOCK_N': 128, 'BLOCK_K': 64, 'num_warps': 4, 'num_stages': 5, 'SWAP_AB': True, 'SPLIT_K': 4},
    (16, 128256, 4096): {'BLOCK_M': 16, 'BLOCK_N': 256, 'BLOCK_K': 128, 'num_warps': 8, 'num_stages': 3, 'PAIRS': 2, 'SWAP_AB': False, 'SPLIT_K': 1},
}
ONE_BITS = 0x3F800000  # float32 1.0: _int4_gemv_kernel's magic number, passed at run time (_gemv_word_terms)
DOT_MIN_BLOCK_K = 32  # one dot per K step; 32 keeps the [BLOCK_K/8, 8, BLOCK_N] nibble tile 4 words deep


@triton.jit
def _group_of(k, G, GROUP_SHIFT: tl.constexpr):
    """k // G, the group of column k >= 0 (a K step's first): one shift where G is a power of two (GROUP_SHIFT =
    log2 G, group_shift; -1: a division by the runtime G, some twenty instructions a step in the sm_90 SASS)."""
    if GROUP_SHIFT >= 0:
        return k >> GROUP_SHIFT
    else:
        return k // G


@triton.jit
def _group_params(scales_ptr, zeros_ptr, k0, offs_r, r_mask, offs_n, n_mask, N, G, ONE_GROUP: tl.constexpr,
                  GROUP_SHIFT: tl.constexpr):
    """(z, s) of a K step in their stored dtype, shaped [1, 1, BLOCK_N] when the step lies in one group, else
    [BLOCK_K/8, 1, BLOCK_N] (the 8 rows of a word share a group: G is a multiple of 8)."""
    if ONE_GROUP:
        offs = _group_of(k0, G, GROUP_SHIFT) * N + offs_n[None, :]
        mask = n_mask[None, :]
    else:
        offs = _group_of(k0 + 8 * offs_r, G, GROUP_SHIFT)[:, None] * N + offs_n[None, :]
        mask = r_mask[:, None] & n_mask[None, :]
    z = tl.load(zeros_ptr + offs, mask=mask, other=0.0)
    s = tl.load(scales_ptr + offs, mask=mask, other=0.0)
    return z[:, None, :], s[:, None, :]


@triton.jit
def _nibbles(words):
    """[BLOCK_K/8, BLOCK_N] words -> [BLOCK_K/8, 8, BLOCK_N] int32 nibbles; [r, j] is row 8r + j of W, so a
    row-major reshape to [BLOCK_K, BLOCK_N] is W's K order (each thread unpacks the words it loaded)."""
    shifts = 4 * tl.arange(0, 8)
    return (words[:, None, :] >> shifts[None, :, None]) & 0xF  # sign bits of j = 7 fall to the mask


@triton.jit
def _exact_float(q, z):
    """q - z as float32, exactly, without a conversion instruction: 0x4B000000 | q read as float32 is 2^23 + q."""
    return (q | 0x4B000000).to(tl.float32, bitcast=True) - (z.to(tl.float32) + 8388608.0)


@triton.jit
def _dequantize(q, z, s, dtype: tl.constexpr, ONE_GROUP: tl.constexpr):
    """The dot's weight tile in dtype from nibbles q [R, 8, N]: q - z where the step lies in one group (its
    scale multiplies the step's sum), else (q - z) * s rounded once to dtype. In 16 bits q - z is made
    without float32: q | 0x4300 is bfloat16 128 + q (0x6400: float16 1024 + q), exact, as is the difference."""
    if ONE_GROUP and dtype == tl.bfloat16:
        return (q | 0x4300).to(tl.int16).to(tl.bfloat16, bitcast=True) - (z.to(tl.float32) + 128.0).to(dtype)
    elif ONE_GROUP and dtype == tl.float16:
        return (q | 0x6400).to(tl.int16).to(tl.float16, bitcast=True) - (z.to(tl.float32) + 1024.0).to(dtype)
    elif ONE_GROUP:
        return _exact_float(q, z).to(dtype)
    else:
        return (_exact_float(q, z) * s.to(tl.float32)).to(dtype)  # rounds W to dtype (weight_rounds)


@triton.jit
def _pair_planes(words, j: tl.constexpr, dtype: tl.constexpr):
    """Nibbles j and j + 4 of every word as two [R, BLOCK_N] tiles in dtype, each MAGIC + q exactly: one
    shift and one mask-or per pair of nibbles (the pair shares a 32-bit word, a half each: 0x4300 | q read
    as bfloat16 is 128 + q, 0x6400 | q as float16 1024 + q), then the halves read as 16-bit floats."""
    if dtype == tl.bfloat16:
        pair = ((words >> (4 * j)) & 0x000F000F) | 0x43004300
    else:
        pair = ((words >> (4 * j)) & 0x000F000F) | 0x64006400
    lo = pair.to(tl.int16).to(dtype, bitcast=True)  # truncates to the low half: nibble j
    hi = (pair >> 16).to(tl.int16).to(dtype, bitcast=True)  # nibble j + 4
    return lo, hi


@triton.jit
def _pairs_tile(words, dtype: tl.constexpr):
    """[R, BLOCK_N] words -> [8R, BLOCK_N] in dtype, row 8r + j = MAGIC + nibble j of word row r (W's K order),
    from _pair_planes' halves joined and permuted: no per-nibble shift, mask or conversion."""
    lo0, hi0 = _pair_planes(words, 0, dtype)
    lo1, hi1 = _pair_planes(words, 1, dtype)
    lo2, hi2 = _pair_planes(words, 2, dtype)
    lo3, hi3 = _pair_planes(words, 3, dtype)
    # [R, N, h, j0, j1] holds nibble 4h + 2j1 + j0
    planes = tl.join(tl.join(tl.join(lo0, hi0), tl.join(lo1, hi1)), tl.join(tl.join(lo2, hi2), tl.join(lo3, hi3)))
    planes = tl.permute(planes, (0, 2, 4, 3, 1))  # [R, h, j1, j0, N]: row 8r + 4h + 2j1 + j0
    return tl.reshape(planes, (8 * words.shape[0], words.shape[1]))


@triton.jit(do_not_specialize=["M"])  # every row count shares one compile per tile shape
def _int4_matmul_kernel(x_ptr, qw_ptr, scales_ptr, zeros_ptr, bias_ptr, out_ptr, partial_ptr, count_ptr,
                        M, N, K, K_SPLIT, G, stride_xm, stride_om, res_ptr, norm_w_ptr, h_ptr, sumsq_ptr, eps, stride_rm,
                        HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        SPLIT_K: tl.constexpr, GROUP_M: tl.constexpr, SWAP_AB: tl.constexpr, EVEN_N: tl.constexpr,
                        EVEN_K: tl.constexpr, ONE_GROUP: tl.constexpr, PRECISION: tl.constexpr,
                        ROW_SUM: tl.constexpr, PAIRS: tl.constexpr, NUM_STAGES: tl.constexpr,
                        GROUP_SHIFT: tl.constexpr = -1, NORM: tl.constexpr = 0, RSTD_GROUPS: tl.constexpr = 0):
    pid_m, pid_n = tile_ids(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    pid_k = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_r = tl.arange(0, BLOCK_K // 8)  # word rows of a K step
    m_mask = offs_m < M
    n_mask = offs_n < N
    k_lo = pid_k * K_SPLIT
    k_hi = tl.minimum(k_lo + K_SPLIT, K)
    w_ptrs = qw_ptr + (k_lo // 8 + offs_r)[:, None] * N + offs_n[None, :]  # [BLOCK_K/8, BLOCK_N]
    if BLOCK_M == 1:
        offs_k = 8 * offs_r[:, None, None] + tl.arange(0, 8)[None, :, None]  # [BLOCK_K/8, 8, 1]: the nibbles' K
        x_ptrs = x_ptr + pid_m * stride_xm + k_lo + offs_k
        if ROW_SUM:
            acc = tl.zeros([BLOCK_K // 8, BLOCK_N], dtype=tl.float32)
        else:
            acc = tl.zeros([BLOCK_K // 8, 8, BLOCK_N], dtype=tl.float32)
    else:
        offs_k = tl.arange(0, BLOCK_K)[None, :]  # [1, BLOCK_K]
        x_ptrs = x_ptr + offs_m[:, None] * stride_xm + k_lo + offs_k  # [BLOCK_M, BLOCK_K]
        if SWAP_AB:
            acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        else:
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    # num_stages named on the loop: Triton software-pipelines a loop without a dot (one row) only when told
    for k0 in tl.range(k_lo, k_hi, BLOCK_K, num_stages=NUM_STAGES):
        r_mask = (k0 + 8 * offs_r) < k_hi
        if EVEN_K and EVEN_N:
            words = tl.load(w_ptrs)
        else:
            words = tl.load(w_ptrs, mask=r_mask[:, None] & n_mask[None, :], other=0)
        if BLOCK_M == 1:
            x = tl.load(x_ptrs, mask=k0 + offs_k < k_hi, other=0.0)  # [BLOCK_K/8, 8, 1]
        else:
            x = tl.load(x_ptrs, mask=m_mask[:, None] & (k0 + offs_k < k_hi), other=0.0)  # [BLOCK_M, BLOCK_K]
        z, s = _group_params(scales_ptr, zeros_ptr, k0, offs_r, r_mask, offs_n, n_mask, N, G, ONE_GROUP, GROUP_SHIFT)
        if PAIRS:  # dot tiles, ONE_GROUP, 16-bit x: dot x with MAGIC + q, then take (MAGIC + z) * sum(x) away
            if PAIRS == 2:  # a dot per nibble plane with x's matching K rows (strided): no join
                d = tl.zeros([BLOCK_N, BLOCK_M] if SWAP_AB else [BLOCK_M, BLOCK_N], dtype=tl.float32)
                x_planes = x_ptr + offs_m[:, None] * stride_xm + k0 + 8 * offs_r[None, :]  # [BLOCK_M, BLOCK_K/8]
                xp_mask = m_mask[:, None] & r_mask[None, :]
                for j in tl.static_range(4):
                    lo, hi = _pair_planes(words, j, x.dtype)
                    x_lo = tl.load(x_planes + j, mask=xp_mask, other=0.0)
                    x_hi = tl.load(x_planes + j + 4, mask=xp_mask, other=0.0)
                    if SWAP_AB:
                        d = tl.dot(tl.trans(lo), tl.trans(x_lo), d, input_precision=PRECISION)
                        d = tl.dot(tl.trans(hi), tl.trans(x_hi), d, input_precision=PRECISION)
                    else:
                        d = tl.dot(x_lo, lo, d, input_precision=PRECISION)
                        d = tl.dot(x_hi, hi, d, input_precision=PRECISION)
            elif SWAP_AB:
                d = tl.dot(tl.trans(_pairs_tile(words, x.dtype)), tl.trans(x), input_precision=PRECISION)
            else:
                d = tl.dot(x, _pairs_tile(words, x.dtype), input_precision=PRECISION)  # [BLOCK_M, BLOCK_N]
            z_row = tl.reshape(z.to(tl.float32), (1, BLOCK_N))
            if x.dtype == tl.bfloat16:
                z_row += 128.0
            else:
                z_row += 1024.0
            s_row = tl.reshape(s.to(tl.float32), (1, BLOCK_N))
            x_sum = tl.sum(x.to(tl.float32), 1)  # [BLOCK_M]
            if SWAP_AB:
                acc += (d - tl.trans(z_row) * x_sum[None, :]) * tl.trans(s_row)
            else:
                acc += (d - x_sum[:, None] * z_row) * s_row
        elif BLOCK_M == 1 and ROW_SUM:  # sum each word's 8 products in its thread, then one scale per word row
            acc += tl.sum(_exact_float(_nibbles(words), z) * x.to(tl.float32), 1) * tl.sum(s.to(tl.float32), 1)
        elif BLOCK_M == 1:  # float32 multiply-add over the whole tile, one sum at the end
            acc += (_exact_float(_nibbles(words), z) * s.to(tl.float32)) * x.to(tl.float32)
        else:
            w = tl.reshape(_dequantize(_nibbles(words), z, s, x.dtype, ONE_GROUP), (BLOCK_K, BLOCK_N))
            if SWAP_AB:  # [BLOCK_N, BLOCK_M]: the weight on the MMA's M side (a wgmma on sm_90 from BLOCK_N = 64)
                if ONE_GROUP:
                    acc += tl.dot(tl.trans(w), tl.trans(x), input_precision=PRECISION) * tl.trans(tl.reshape(
                        s.to(tl.float32), (1, BLOCK_N)))
                else:
                    acc = tl.dot(tl.trans(w), tl.trans(x), acc, input_precision=PRECISION)
            elif ONE_GROUP:
                acc += tl.dot(x, w, input_precision=PRECISION) * tl.reshape(s.to(tl.float32), (1, BLOCK_N))
            else:
                acc = tl.dot(x, w, acc, input_precision=PRECISION)
        w_ptrs += (BLOCK_K // 8) * N
        x_ptrs += BLOCK_K
    if BLOCK_M == 1 and ROW_SUM:
        acc = tl.sum(acc, 0)[None, :]  # [1, BLOCK_N]
    elif BLOCK_M == 1:
        acc = tl.sum(tl.sum(acc, 1), 0)[None, :]  # [1, BLOCK_N]
    elif SWAP_AB:
        acc = tl.trans(acc)
    if RSTD_GROUPS > 0:  # as _int4_gemv_kernel's
        acc = acc * _sumsq_rstd(sumsq_ptr, offs_m, m_mask, K, eps, RSTD_GROUPS)
    finish_tile(acc, bias_ptr, out_ptr, partial_ptr, count_ptr, pid_n, pid_k, offs_m, offs_n, m_mask, n_mask, N,
                stride_om, HAS_BIAS, BLOCK_M, BLOCK_N, SPLIT_K, res_ptr=res_ptr, sumsq_ptr=sumsq_ptr,
                stride_rm=stride_rm, norm_w_ptr=norm_w_ptr, h_ptr=h_ptr, NORM=NORM)


@triton.jit
def _gemv_word_terms(w, xs, t0, one):
    """t0 + sum_j x'_j f_j over a word's 8 nibbles (w: int32 words, xs: the 8 x' columns), five shifts for eight
    nibbles: each shifted word puts one nibble at bits 19..22 (f = 1 + q / 16) and one at 15..18 (f = 1 +
    q / 256, x' = 16 x), or-ed under 1.0's exponent (one: 0x3F800000, a runtime argument so that ptxas keeps
    it in a register for every LOP3 instead of re-materialising a constant)."""
    hi = 0x00780000
    lo = 0x00078000
    a = w << 19  # nibble 0 at 19
    b = w << 11  # 2 at 19, 1 at 15
    c = w << 3  # 4 at 19, 3 at 15
    d = w >> 5  # 6 at 19, 5 at 15
    e = w >> 9  # 7 at 19
    t = ((a & hi) | one).to(tl.float32, bitcast=True) * xs[0] + t0
    t += ((b & lo) | one).to(tl.float32, bitcast=True) * xs[1]
    t += ((b & hi) | one).to(tl.float32, bitcast=True) * xs[2]
    t += ((c & lo) | one).to(tl.float32, bitcast=True) * xs[3]
    t += ((c & hi) | one).to(tl.float32, bitcast=True) * xs[4]
    t += ((d & lo) | one).to(tl.float32, bitcast=True) * xs[5]
    t += ((d & hi) | one).to(tl.float32, bitcast=True) * xs[6]
    t += ((e & hi) | one).to(tl.float32, bitcast=True) * xs[7]
    return t


@triton.jit
def _columns(ptrs, mask, EVEN_N: tl.constexpr):
    """The values at ptrs, 0 where mask is off; EVEN_N (every column exists): an unpredicated load, with no
    registers zeroed before it."""
    if EVEN_N:
        return tl.load(ptrs)
    else:
        return tl.load(ptrs, mask=mask, other=0)


@triton.jit
def _gemv_step_loads(qw_ptr, x_ptr, scales_ptr, zeros_ptr, k0, G, N, offs_a, offs_r, a_mask, b_mask,
                     HALF: tl.constexpr, EVEN_N: tl.constexpr, GROUP_SHIFT: tl.constexpr):
    """The operands of the K step at k0: both halves' words, their group's scales and zeros (G % BLOCK_K == 0),
    the 8 x columns of its word rows."""
    a_ptrs = qw_ptr + ((k0 >> 3) + offs_r)[:, None] * N + offs_a[None, :]  # [BLOCK_K/8, HALF]
    wa = _columns(a_ptrs, a_mask[None, :], EVEN_N)
    wb = _columns(a_ptrs + HALF, b_mask[None, :], EVEN_N)
    ga = _group_of(k0, G, GROUP_SHIFT) * N + offs_a
    za = _columns(zeros_ptr + ga, a_mask, EVEN_N)
    sa = _columns(scales_ptr + ga, a_mask, EVEN_N)
    zb = _columns(zeros_ptr + ga + HALF, b_mask, EVEN_N)
    sb = _columns(scales_ptr + ga + HALF, b_mask, EVEN_N)
    x_ptrs = x_ptr + k0 + 8 * offs_r  # x[8r + k0], the first K of each word row (offsets: the loads' immediates)
    xs = (tl.load(x_ptrs), tl.load(x_ptrs + 1), tl.load(x_ptrs + 2), tl.load(x_ptrs + 3), tl.load(x_ptrs + 4),
          tl.load(x_ptrs + 5), tl.load(x_ptrs + 6), tl.load(x_ptrs + 7))
    return wa, wb, za, sa, zb, sb, xs


@triton.jit
def _gemv_step(step, acc_a, acc_b, one):
    """acc_h += sum_j x_j (q_j - z) s over one K step's word rows, both halves (_int4_gemv_kernel)."""
    wa, wb, za, sa, zb, sb, xs = step
    x0 = xs[0].to(tl.float32)
    x1 = xs[1].to(tl.float32)
    x2 = xs[2].to(tl.float32)
    x3 = xs[3].to(tl.float32)
    x4 = xs[4].to(tl.float32)
    x5 = xs[5].to(tl.float32)
    x6 = xs[6].to(tl.float32)
    x7 = xs[7].to(tl.float32)
    x_hi = (x0 + x2) + (x4 + x6) + x7  # the nibbles at bits 19..22
    x_lo = (x1 + x3) + x5  # ... at bits 15..18: their x' = 16 x
    x_sum = x_hi + x_lo  # [BLOCK_K/8]: sum_j x_j of each word row
    x_off = x_hi + 16.0 * x_lo  # sum_j x'_j: what the offsets (the 1 of every f) add to t
    terms = (x0[:, None], 16.0 * x1[:, None], x2[:, None], 16.0 * x3[:, None], x4[:, None], 16.0 * x5[:, None],
             x6[:, None], x7[:, None])
    ta = _gemv_word_terms(wa, terms, -x_off[:, None], one)  # sum_j x_j q_j / 16
    tb = _gemv_word_terms(wb, terms, -x_off[:, None], one)
    za = za.to(tl.float32)
    sa = sa.to(tl.float32)
    zb = zb.to(tl.float32)
    sb = sb.to(tl.float32)
    acc_a += ta * (16.0 * sa)[None, :] - x_sum[:, None] * (sa * za)[None, :]  # sum_j x_j (q_j - z) s
    acc_b += tb * (16.0 * sb)[None, :] - x_sum[:, None] * (sb * zb)[None, :]
    return acc_a, acc_b


@triton.jit
def _pack_f16x2(lo, hi):
    """Two float32 tiles rounded to float16 (to nearest) and packed, lo in the low half: one cvt a pair."""
    return tl.inline_asm_elementwise("cvt.rn.f16x2.f32 $0, $2, $1;", "=r,r,r", [lo, hi], dtype=tl.int32,
                                     is_pure=True, pack=1)


# one word's nibbles as four float16 pairs q - 8 in t0..t3 (word {w}): t0 holds nibbles 0 and 4, t1 1 and 5 (as
# 1024 + 16 q before the multiply-add by 1/16), t2 2 and 6, t3 3 and 7
_WORD_PAIRS_PTX = """
    lop3.b32 t0, {w}, 0x000F000F, 0x64006400, 0xEA;
    lop3.b32 t1, {w}, 0x00F000F0, 0x64006400, 0xEA;
    shr.u32 w8, {w}, 8;
    lop3.b32 t2, w8, 0x000F000F, 0x64006400, 0xEA;
    lop3.b32 t3, w8, 0x00F000F0, 0x64006400, 0xEA;
    sub.f16x2 t0, t0, c1032;
    fma.rn.f16x2 t1, t1, c16th, cm72;
    sub.f16x2 t2, t2, c1032;
    fma.rn.f16x2 t3, t3, c16th, cm72;"""
_PAIR_DOT_PTX = tl.constexpr("""{
    .reg .b32 w8, t0, t1, t2, t3, a, c1032, c16th, cm72;
    .reg .b16 lo, hi;
    .reg .f32 flo, fhi;
    mov.b32 c1032, 0x64086408;
    mov.b32 c16th, 0x2C002C00;
    mov.b32 cm72, 0xD480D480;""" + _WORD_PAIRS_PTX.format(w="$1") + """
    mul.rn.f16x2 a, t0, $3;
    fma.rn.f16x2 a, t1, $4, a;
    fma.rn.f16x2 a, t2, $5, a;
    fma.rn.f16x2 a, t3, $6, a;""" + _WORD_PAIRS_PTX.format(w="$2") + """
    fma.rn.f16x2 a, t0, $7, a;
    fma.rn.f16x2 a, t1, $8, a;
    fma.rn.f16x2 a, t2, $9, a;
    fma.rn.f16x2 a, t3, $10, a;
    mov.b32 {lo, hi}, a;
    cvt.f32.f16 flo, lo;
    cvt.f32.f16 fhi, hi;
    add.f32 $0, flo, fhi;
    }""")


@triton.jit
def _word_pair_dot16(w0, w1, p0, p1, p2, p3, r0, r1, r2, r3):
    """sum_j x'_j (q_j - 8) over two words of one column (8 nibbles each), x' packed float16 pairs (p: w0's row,
    r: w1's): per word one shift and four LOP3 make four float16 pairs 1024 + q (nibbles j, j + 4 at bits 0..3)
    or 1024 + 16 q (at bits 4..7), two subtractions of 1032 and two multiply-adds (x 1/16, - 72) make q - 8 exactly,
    four packed multiply-adds sum the products; one float32 sum of the two lanes at the end."""
    return tl.inline_asm_elementwise(_PAIR_DOT_PTX, "=r,r,r,r,r,r,r,r,r,r,r", [w0, w1, p0, p1, p2, p3, r0, r1, r2, r3],
                                     dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def _fma16(a, b, c):
    """fma.rn.f16's value for float16 a, b, c: the float32 product of two float16 values is exact, so one
    rounding of product + c to float16 (up to a double rounding where the float32 sum itself rounds)."""
    return (a.to(tl.float32) * b.to(tl.float32) + c.to(tl.float32)).to(tl.float16)


@triton.jit
def _word_pair_dot16_emulated(w0, w1, xe, xo):
    """_word_pair_dot16 in float16 tensor arithmetic, the same operations in the same order (Triton's
    interpreter runs no PTX): xe, xo the two rows' x' as 8 float16 [R/2, 1] tiles each."""
    lo = tl.zeros(w0.shape, tl.float16)
    hi = tl.zeros(w0.shape, tl.float16)
    for j in tl.static_range(4):
        lo = _fma16((((w0 >> (4 * j)) & 0xF) - 8).to(tl.float16), xe[j], lo)
        hi = _fma16((((w0 >> (4 * j + 16)) & 0xF) - 8).to(tl.float16), xe[j + 4], hi)
    for j in tl.static_range(4):
        lo = _fma16((((w1 >> (4 * j)) & 0xF) - 8).to(tl.float16), xo[j], lo)
        hi = _fma16((((w1 >> (4 * j + 16)) & 0xF) - 8).to(tl.float16), xo[j + 4], hi)
    return lo.to(tl.float32) + hi.to(tl.float32)


@triton.jit
def _row_x(x_ptr, rows):
    """The 8 x values of each word row in rows, float32."""
    return (tl.load(x_ptr + rows).to(tl.float32), tl.load(x_ptr + rows + 1).to(tl.float32),
            tl.load(x_ptr + rows + 2).to(tl.float32), tl.load(x_ptr + rows + 3).to(tl.float32),
            tl.load(x_ptr + rows + 4).to(tl.float32), tl.load(x_ptr + rows + 5).to(tl.float32),
            tl.load(x_ptr + rows + 6).to(tl.float32), tl.load(x_ptr + rows + 7).to(tl.float32))


@triton.jit
def _gemv16_x(x_ptr, even, F16: tl.constexpr):
    """The x side of a K step of word-row pairs (rows even and even + 1, [BLOCK_K/16]) for _gemv16_part: each pair's
    16 x values scaled by one power of two 2^-E into [-2, 2) (E: the exponent of their max |x|), so that float16
    holds them and their products with q - 8 in [-8, 7] (a pair's lane sums 8 of them: at most 128 in size).
    Returns (x', 2^E, sum_j x_j): x' as 8 packed float16 pairs (F16 1: _word_pair_dot16's operands) or 16 float16
    tiles (2: its emulation), each [BLOCK_K/16, 1]."""
    xe = _row_x(x_ptr, 8 * even)
    xo = _row_x(x_ptr, 8 * even + 8)
    m = tl.abs(xe[0])
    for j in tl.static_range(1, 8):
        m = tl.maximum(m, tl.abs(xe[j]))
    for j in tl.static_range(8):
        m = tl.maximum(m, tl.abs(xo[j]))
    bits = m.to(tl.int32, bitcast=True) & 0x7F800000
    up = bits.to(tl.float32, bitcast=True)  # 2^E (0 for a pair of zeros, whose x' are then 0)
    inv = (0x7F000000 - bits).to(tl.float32, bitcast=True)  # 2^-E
    x_sum = ((xe[0] + xe[1]) + (xe[2] + xe[3])) + ((xe[4] + xe[5]) + (xe[6] + xe[7])) \
        + (((xo[0] + xo[1]) + (xo[2] + xo[3])) + ((xo[4] + xo[5]) + (xo[6] + xo[7])))
    if F16 == 1:
        xq = (_pack_f16x2(xe[0] * inv, xe[4] * inv)[:, None], _pack_f16x2(xe[1] * inv, xe[5] * inv)[:, None],
              _pack_f16x2(xe[2] * inv, xe[6] * inv)[:, None], _pack_f16x2(xe[3] * inv, xe[7] * inv)[:, None],
              _pack_f16x2(xo[0] * inv, xo[4] * inv)[:, None], _pack_f16x2(xo[1] * inv, xo[5] * inv)[:, None],
              _pack_f16x2(xo[2] * inv, xo[6] * inv)[:, None], _pack_f16x2(xo[3] * inv, xo[7] * inv)[:, None])
    else:
        xq = ((xe[0] * inv).to(tl.float16)[:, None], (xe[1] * inv).to(tl.float16)[:, None],
              (xe[2] * inv).to(tl.float16)[:, None], (xe[3] * inv).to(tl.float16)[:, None],
              (xe[4] * inv).to(tl.float16)[:, None], (xe[5] * inv).to(tl.float16)[:, None],
              (xe[6] * inv).to(tl.float16)[:, None], (xe[7] * inv).to(tl.float16)[:, None],
              (xo[0] * inv).to(tl.float16)[:, None], (xo[1] * inv).to(tl.float16)[:, None],
              (xo[2] * inv).to(tl.float16)[:, None], (xo[3] * inv).to(tl.float16)[:, None],
              (xo[4] * inv).to(tl.float16)[:, None], (xo[5] * inv).to(tl.float16)[:, None],
              (xo[6] * inv).to(tl.float16)[:, None], (xo[7] * inv).to(tl.float16)[:, None])
    return xq, up[:, None], x_sum[:, None]


@triton.jit
def _gemv16_part(qw_ptr, scales_ptr, zeros_ptr, even, g, N, offs, mask, x, acc, F16: tl.constexpr,
                 EVEN_N: tl.constexpr):
    """acc += sum_j x_j (q_j - z) s over one K step (inside one group) for the columns offs, x from _gemv16_x:
    sum_j x_j (q_j - z) = 2^E sum_j x'_j (q_j - 8) + (8 - z) sum_j x_j, the first in packed float16 a word pair at
    a time (F16 1: _word_pair_dot16; 2: its emulation), the second in float32."""
    xq, up, x_sum = x
    w0 = _columns(qw_ptr + even[:, None] * N + offs[None, :], mask[None, :], EVEN_N)
    w1 = _columns(qw_ptr + (even + 1)[:, None] * N + offs[None, :], mask[None, :], EVEN_N)
    z = _columns(zeros_ptr + g + offs, mask, EVEN_N).to(tl.float32)
    s = _columns(scales_ptr + g + offs, mask, EVEN_N).to(tl.float32)
    if F16 == 1:
        t = _word_pair_dot16(w0, w1, xq[0], xq[1], xq[2], xq[3], xq[4], xq[5], xq[6], xq[7])
    else:
        t = _word_pair_dot16_emulated(w0, w1, (xq[0], xq[1], xq[2], xq[3], xq[4], xq[5], xq[6], xq[7]),
                                      (xq[8], xq[9], xq[10], xq[11], xq[12], xq[13], xq[14], xq[15]))
    return acc + (t * up + (8.0 - z)[None, :] * x_sum) * s[None, :]


@triton.jit
def _int4_gemv_kernel(x_ptr, qw_ptr, scales_ptr, zeros_ptr, bias_ptr, out_ptr, partial_ptr, count_ptr, N, K, K_SPLIT, G, one,
                      res_ptr, norm_w_ptr, h_ptr, sumsq_ptr, eps,
                      HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
                      EVEN_N: tl.constexpr, NUM_STAGES: tl.constexpr, PREFETCH: tl.constexpr,
                      PDL: tl.constexpr = False, F16: tl.constexpr = 0, PARTS: tl.constexpr = 2,
                      GROUP_SHIFT: tl.constexpr = -1, EPILOGUE: tl.constexpr = 0, NORM: tl.constexpr = 0,
                      RSTD_GROUPS: tl.constexpr = 0):
    """One row (GEMV), K steps inside one group (G % BLOCK_K == 0): y = x @ W^T at about four instructions per
    weight in the sm_90 SASS (the multiply-add tile above: about ten), so that it can stream the weight rather
    than wait on the issue slots. Per word, _gemv_word_terms: five shifts put each of its 8 nibbles at bits
    19..22 or 15..18 of some shifted copy, and one LOP3 each (mask, or 1.0's exponent) reads it as float32
    f = 1 + q / 16 or 1 + q / 256 exactly, then one FFMA, t += f * x' (x' = 16 x for the second kind). Per
    word row, t starts at -sum_j x'_j, so t = sum_j x_j q_j / 16, and sum_j x_j (q_j - z) s = 16 s t -
    s z sum_j x_j: the offsets taken away are of q's own size (at most 16x), a few bits of float32, not
    the 23 that 2^23 + q would cost. Each program's columns come as two halves that share every x value a
    thread loads and converts. PREFETCH loads the next step's operands into registers before this step's
    arithmetic (the last step of a split loads K's last step again, unused, instead of masking). EPILOGUE (1 silu,
    2 tanh GELU): the columns are an interleaved gate_up's (gate j, up j) pairs, and the program that stores a tile
    stores act(gate) * up, half as many columns (finish_tile). NORM (1 w, 2 1 + w): the add_rms_norm after this
    product as far as a tile goes (finish_tile: h = y + residual, h * w, h's sums of squares); RSTD_GROUPS (> 0, a
    power of two >= K / 16): x is such an h * w, and the sums are scaled by the row's 1 / rms from sumsq_ptr's
    K / 16 sums of squares before the split-K finish (the bias after it)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    HALF: tl.constexpr = BLOCK_N // 2
    offs_a = pid_n * BLOCK_N + tl.arange(0, HALF)  # two column halves share every x value a thread loads
    offs_b = offs_a + HALF
    offs_r = tl.arange(0, BLOCK_K // 8)
    a_mask = offs_a < N
    b_mask = offs_b < N
    k_lo = pid_k * K_SPLIT
    k_hi = tl.minimum(k_lo + K_SPLIT, K)
    if PDL:  # programmatic dependent launch (launch.py), prefetching this program's first K step of words (a
        # 128-byte line is 32 columns of a word row; rows past N read column N - 1 again)
        columns = tl.minimum(pid_n * BLOCK_N + 32 * tl.arange(0, BLOCK_N // 32 if BLOCK_N >= 32 else 1), N - 1)
        dependent_start(qw_ptr + (k_lo // 8 + offs_r).to(tl.int64)[:, None] * N + columns[None, :])
    if F16:  # word rows in pairs, the columns in PARTS parts that share every x value a thread converts
        PART: tl.constexpr = BLOCK_N // PARTS
        offs_0 = pid_n * BLOCK_N + tl.arange(0, PART)
        offs_p = tl.arange(0, BLOCK_K // 16)
        acc_0 = tl.zeros([BLOCK_K // 16, PART], dtype=tl.float32)
        acc_1 = tl.zeros([BLOCK_K // 16, PART], dtype=tl.float32)
        acc_2 = tl.zeros([BLOCK_K // 16, PART], dtype=tl.float32)
        acc_3 = tl.zeros([BLOCK_K // 16, PART], dtype=tl.float32)
        for k0 in tl.range(k_lo, k_hi, BLOCK_K, num_stages=NUM_STAGES):
            even = (k0 >> 3) + 2 * offs_p
            g = _group_of(k0, G, GROUP_SHIFT) * N
            x = _gemv16_x(x_ptr, even, F16)
            acc_0 = _gemv16_part(qw_ptr, scales_ptr, zeros_ptr, even, g, N, offs_0, offs_0 < N, x, acc_0, F16, EVEN_N)
            acc_1 = _gemv16_part(qw_ptr, scales_ptr, zeros_ptr, even, g, N, offs_0 + PART, offs_0 + PART < N, x,
                                 acc_1, F16, EVEN_N)
            if PARTS == 4:
                acc_2 = _gemv16_part(qw_ptr, scales_ptr, zeros_ptr, even, g, N, offs_0 + 2 * PART,
                                     offs_0 + 2 * PART < N, x, acc_2, F16, EVEN_N)
                acc_3 = _gemv16_part(qw_ptr, scales_ptr, zeros_ptr, even, g, N, offs_0 + 3 * PART,
                                     offs_0 + 3 * PART < N, x, acc_3, F16, EVEN_N)
        if PARTS == 4:  # [PART, 2, 2] (part 2c + h at [:, h, c]) -> [4, PART] in column order
            out = tl.join(tl.join(tl.sum(acc_0, 0), tl.sum(acc_1, 0)), tl.join(tl.sum(acc_2, 0), tl.sum(acc_3, 0)))
            out = tl.reshape(tl.permute(out, (2, 1, 0)), (1, BLOCK_N))
        else:
            out = tl.reshape(tl.permute(tl.join(tl.sum(acc_0, 0), tl.sum(acc_1, 0)), (1, 0)), (1, BLOCK_N))
    elif PREFETCH:  # the next step's words, scales, zeros and x are loaded before this step's arithmetic
        acc_a = tl.zeros([BLOCK_K // 8, HALF], dtype=tl.float32)
        acc_b = tl.zeros([BLOCK_K // 8, HALF], dtype=tl.float32)
        step = _gemv_step_loads(qw_ptr, x_ptr, scales_ptr, zeros_ptr, k_lo, G, N, offs_a, offs_r, a_mask, b_mask,
                                HALF, EVEN_N, GROUP_SHIFT)
        for k0 in range(k_lo, k_hi, BLOCK_K):
            # after a split's last step: a step that exists (K's last), loaded and not used, instead of masks
            k_next = tl.minimum(k0 + BLOCK_K, K - BLOCK_K)
            following = _gemv_step_loads(qw_ptr, x_ptr, scales_ptr, zeros_ptr, k_next, G, N, offs_a, offs_r,
                                         a_mask, b_mask, HALF, EVEN_N, GROUP_SHIFT)
            acc_a, acc_b = _gemv_step(step, acc_a, acc_b, one)
            step = following
    else:
        acc_a = tl.zeros([BLOCK_K // 8, HALF], dtype=tl.float32)
        acc_b = tl.zeros([BLOCK_K // 8, HALF], dtype=tl.float32)
        for k0 in tl.range(k_lo, k_hi, BLOCK_K, num_stages=NUM_STAGES):
            step = _gemv_step_loads(qw_ptr, x_ptr, scales_ptr, zeros_ptr, k0, G, N, offs_a, offs_r, a_mask,
                                    b_mask, HALF, EVEN_N, GROUP_SHIFT)
            acc_a, acc_b = _gemv_step(step, acc_a, acc_b, one)
    if not F16:
        out = tl.reshape(tl.permute(tl.join(tl.sum(acc_a, 0), tl.sum(acc_b, 0)), (1, 0)), (1, BLOCK_N))
    offs_m = tl.arange(0, 1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if RSTD_GROUPS > 0:
        out = out * _sumsq_rstd(sumsq_ptr, offs_m, offs_m < 1, K, eps, RSTD_GROUPS)
    finish_tile(out, bias_ptr, out_ptr, partial_ptr, count_ptr, pid_n, pid_k, offs_m, offs_n, offs_m < 1, offs_n < N,
                N, 0, HAS_BIAS, 1, BLOCK_N, SPLIT_K, res_ptr=res_ptr, sumsq_ptr=sumsq_ptr, EPILOGUE=EPILOGUE,
                norm_w_ptr=norm_w_ptr, h_ptr=h_ptr, NORM=NORM)


def group_shift(group_size: int) -> int:
    """The kernels' GROUP_SHIFT: log2 of a power-of-two group size, else -1 (they divide by it)."""
    return group_size.bit_length() - 1 if group_size & (group_size - 1) == 0 else -1


def decode_split(n: int, k: int, block_n: int, block_k: int, device: torch.device) -> int:
    """K splits for a one-row-tile grid: about four programs per SM (the H200 sweep: 4 splits of qkv's 96
    column tiles beat 2 and 3 by 1.2-1.6x), at most 8, at least four K steps per split."""
    split = min(8, triton.cdiv(4 * sm_count(device), triton.cdiv(n, block_n)))
    return max(1, min(split, k // (4 * block_k)))


def default_config(m: int, n: int, k: int, device: torch.device) -> dict:
    """Measured configs first (CONFIGS), else (guesses from the H200 sweep of the previous kernel): 1..16
    rows in one 16-row dot tile of [128, 64] (one group of 128 per step, 4 KB of words per program and
    step) with decode_split's K splits; more rows in 64 x 128 GEMM tiles."""
    if (m_bucket(m), n, k) in CONFIGS:
        return CONFIGS[(m_bucket(m), n, k)]
    if m <= MAX_ROWS:
        return {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "SWAP_AB": False, "num_warps": 4, "num_stages": 4,
                "SPLIT_K": decode_split(n, k, 64, 128, device)}
    return {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 8, "num_warps": 8, "num_stages": 3}


def pairs(m: int, k: int, group_size: int, dtype: torch.dtype, config: dict) -> bool:
    """Whether a launch unpacks nibble pairs (config PAIRS): dot tiles whose K steps lie in one group, x in 16
    bits (the magic numbers are 16-bit floats)."""
    block_m, block_k = tile_shape(m, k, config, DOT_MIN_BLOCK_K)
    usable = block_m > 1 and group_size % block_k == 0 and dtype in (torch.bfloat16, torch.float16)
    return int(config.get("PAIRS", 0)) if usable and (config.get("PAIRS", 0) != 2 or block_k >= 128) else 0


def gemv(m: int, k: int, group_size: int, config: dict) -> bool:
    """Whether a launch takes _int4_gemv_kernel (config GEMV): one row, K steps that lie in one group."""
    block_m, block_k = tile_shape(m, k, config, DOT_MIN_BLOCK_K)
    pairs_ok = not config.get("F16") or (block_k % 16 == 0 and config["BLOCK_N"] >= 4 * gemv_parts(config))
    return bool(config.get("GEMV")) and block_m == 1 and group_size % block_k == 0 and block_k % 8 == 0 and pairs_ok


def gemv_f16(x: torch.Tensor, config: dict) -> int:
    """_int4_gemv_kernel's F16 for a launch over x: 0 unless the config asks for packed float16 arithmetic (F16)
    and x is 16-bit; then 1 on a GPU (its PTX), 2 elsewhere (Triton's interpreter: the same operations in float16
    tensors)."""
    if not config.get("F16") or x.dtype not in (torch.bfloat16, torch.float16):
        return 0
    return 1 if x.is_cuda else 2


def gemv_parts(config: dict) -> int:
    """Column parts of an F16 GEMV program (config F16: True or 2 for two, 4 for four): the parts share each x
    value a thread loads and converts, so more of them spread the x side's work over more words."""
    return 4 if config.get("F16") == 4 else 2


def weight_rounds(m: int, k: int, group_size: int, config: dict) -> bool:
    """Whether int4_matmul rounds the dequantized weight to x's dtype (module docstring): dot tiles whose
    K step spans groups."""
    block_m, block_k = tile_shape(m, k, config, DOT_MIN_BLOCK_K)
    return block_m > 1 and group_size % block_k != 0


def int4_matmul(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                bias: torch.Tensor | None = None, config: dict | None = None, epilogue: int = 0,
                rstd: tuple[torch.Tensor, float] | None = None) -> torch.Tensor:
    """int4_linear_reference(x, qweight, scales, zeros, bias) for x: [M, K] (last-dim stride 1), qweight:
    int32 [K/8, N], scales and zeros: [K/G, N] (all contiguous), bias: [N] or None -> a new contiguous
    [M, N] in x's dtype. config: default_config's keys (BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, SWAP_AB, GROUP_M,
    num_warps, num_stages); dot tiles (BLOCK_M > 1) take BLOCK_K >= DOT_MIN_BLOCK_K. epilogue (1 silu, 2 tanh
    GELU; only where fuses_activation): the columns are an interleaved gate_up's (gate j, up j) pairs
    (skinny_matmul.interleave_gate_up along N) and the result is act(gate) * up, [M, N / 2], as silu_and_mul
    rounds it. rstd (sumsq [M, K/16] float32, eps; M <= 16): x is h * w of an RMSNorm whose rows' sums of squares
    sumsq holds (int4_matmul_add_norm's), and each row's sums are scaled by 1 / sqrt(mean(h^2) + eps) before the
    bias: the product of the norm's output, with x's rounding before the 1 / rms rather than after."""
    return _int4_launch(x, qweight, scales, zeros, bias, config, epilogue, None, rstd)[0]


def int4_matmul_add_norm(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                         bias: torch.Tensor | None, residual: torch.Tensor, norm_weight: torch.Tensor,
                         unit_offset: bool = False, config: dict | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """int4_matmul and the add_rms_norm after it as far as a column tile goes, M <= 16, one launch: y (rounded as the
    linear's output), h = y + residual (rounded as the norm's add: the new residual), xn = h * norm_weight (1 +
    norm_weight with unit_offset, in float32, rounded to x's dtype) and sumsq [M, N/16] float32, h's sums of
    squares over 16 columns. Returns (xn, h, sumsq): int4_matmul(xn, ..., rstd=(sumsq, eps)) is the next linear."""
    return _int4_launch(x, qweight, scales, zeros, bias, config, 0, (residual, norm_weight, unit_offset), None)


def _int4_launch(x, qweight, scales, zeros, bias, config, epilogue, norm, rstd):
    """(out, h, sumsq) of one launch: int4_matmul's arguments, norm (residual, norm_weight, unit_offset) or None
    (int4_matmul_add_norm's), rstd (sumsq, eps) or None; h and sumsq are None without norm."""
    m, k = x.shape
    n = qweight.shape[1]
    group_size = k // scales.shape[0]
    check_int4_shape(n, k, group_size)
    assert qweight.dtype == torch.int32 and qweight.shape == (k // INT4_PACK, n) and x.stride(-1) == 1
    assert scales.shape == zeros.shape == (k // group_size, n)
    assert qweight.is_contiguous() and scales.is_contiguous() and zeros.is_contiguous()
    out = x.new_empty((m, n // 2 if epilogue else n))
    h = sumsq = None
    if norm is not None:
        residual, norm_weight, unit_offset = norm
        assert residual.shape == (m, n) and residual.stride(-1) == 1 and norm_weight.shape == (n,)
        assert n % SUMSQ_GROUP == 0 and not epilogue
        h = torch.empty_like(out)
        sumsq = torch.empty((m, n // SUMSQ_GROUP), dtype=torch.float32, device=x.device)
    if rstd is not None:
        assert k % SUMSQ_GROUP == 0 and rstd[0].shape == (m, k // SUMSQ_GROUP) and rstd[0].dtype == torch.float32
    if m == 0:
        return out, h, sumsq
    config = config or default_config(m, n, k, x.device)
    plan = plan_launch(m, n, k, config, x.device, DOT_MIN_BLOCK_K)
    fold = dict(NORM=0 if norm is None else 2 if norm[2] else 1,
                RSTD_GROUPS=0 if rstd is None else triton.next_power_of_2(k // SUMSQ_GROUP))
    res, norm_w = (out, out) if norm is None else norm[:2]
    sums, eps = (sumsq if sumsq is not None else out, 0.0) if rstd is None else rstd
    folds = (res, norm_w, out if h is None else h, sums, eps)
    if gemv(m, k, group_size, config):
        _launch_gemv(x, qweight, scales, zeros, bias, out, config, plan, group_size, epilogue, folds, fold)
        return out, h, sumsq
    assert not epilogue, "int4_matmul's activation epilogue needs the one-row GEMV (fuses_activation)"
    assert (norm is None and rstd is None) or plan.block_m <= MAX_ROWS, "the norm fold: rows in one dot tile"
    _int4_matmul_kernel[plan.grid](
        x, qweight, scales, zeros, scales if bias is None else bias, out,
        out if plan.partial is None else plan.partial, out if plan.counters is None else plan.counters,
        m, n, k, plan.k_split, group_size, x.stride(0), out.stride(0), *folds, res.stride(0),
        HAS_BIAS=bias is not None, BLOCK_M=plan.block_m, BLOCK_N=config["BLOCK_N"], BLOCK_K=plan.block_k,
        SPLIT_K=plan.split_k, GROUP_M=config.get("GROUP_M", 8), SWAP_AB=config.get("SWAP_AB", False),
        EVEN_N=n % config["BLOCK_N"] == 0, EVEN_K=plan.k_split * plan.split_k == k,
        ONE_GROUP=group_size % plan.block_k == 0,
        PRECISION=dot_precision(x.dtype), ROW_SUM=config.get("ROW_SUM", False),
        PAIRS=pairs(m, k, group_size, x.dtype, config), NUM_STAGES=config["num_stages"],
        GROUP_SHIFT=group_shift(group_size), **fold,
        num_warps=config["num_warps"], num_stages=config["num_stages"])
    return out, h, sumsq


def fuses_activation(m: int, n: int, k: int, group_size: int, device: torch.device) -> bool:
    """Whether int4_matmul takes epilogue for these rows and shape ([N, K] with N the interleaved gate_up's
    width): where the default config runs the one-row GEMV and its column tiles hold whole pairs."""
    config = default_config(m, n, k, device)
    return n % 2 == 0 and config["BLOCK_N"] % 2 == 0 and gemv(m, k, group_size, config)


def _launch_gemv(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                 bias: torch.Tensor | None, out: torch.Tensor, config: dict, plan, group_size: int,
                 epilogue: int, folds: tuple, fold: dict) -> None:
    """_int4_gemv_kernel over one row; folds: (residual, norm weight, h, sumsq, eps), fold: NORM, RSTD_GROUPS."""
    k, n = qweight.shape[0] * INT4_PACK, qweight.shape[1]
    _int4_gemv_kernel[plan.grid](
        x, qweight, scales, zeros, scales if bias is None else bias, out,
        out if plan.partial is None else plan.partial, out if plan.counters is None else plan.counters,
        n, k, plan.k_split, group_size, ONE_BITS, *folds, HAS_BIAS=bias is not None, BLOCK_N=config["BLOCK_N"],
        BLOCK_K=plan.block_k, SPLIT_K=plan.split_k, EVEN_N=n % config["BLOCK_N"] == 0,
        GROUP_SHIFT=group_shift(group_size),
        NUM_STAGES=config["num_stages"], PREFETCH=config.get("PREFETCH", False), num_warps=config["num_warps"],
        num_stages=config["num_stages"], F16=gemv_f16(x, config), PARTS=gemv_parts(config), EPILOGUE=epilogue,
        **fold, **pdl_launch(x.device))

