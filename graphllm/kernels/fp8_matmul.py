"""y = quant(x) @ W^T * scales (+ bias) for a W8A8 float8 linear: a Triton kernel at decode batch sizes,
float8 quantization of x, and torch._scaled_mm beyond.

    x [M, K] float16 / bfloat16 / float32 (last-dim stride 1), weight float8_e4m3fn [N, K] (contiguous),
    weight_scale float32 [N], input_scale float32 [1] or None, bias [N] or None  ->  y [M, N] in x's dtype
    y = (xq @ weight^T) * x_scale * weight_scale (+ bias),  xq = clamp(x / x_scale, +-448) as float8,
    x_scale = max|x_row| / 448 per row (dynamic), or input_scale (static)   (quant_layout.fp8_linear_reference)

Where rows go (fp8_matmul):

    rows                      path
    1..16                     _fp8_matmul_kernel, one 16-row tile (or a one-row multiply-add): streams the weight
    17.. bf16, no CONFIGS     fp8_quantize_rows, then torch._scaled_mm with row-wise scales (cuBLAS / CUTLASS)
    17.. otherwise            _fp8_matmul_kernel in GEMM tiles (default 128 x 128, no K split)

_fp8_matmul_kernel is int8_matmul's kernel with float8 operands: grid (tiles_m * tiles_n, SPLIT_K),
[BLOCK_N, BLOCK_K] weight tiles, skinny_matmul.finish_tile's deterministic K-split reduction. SWAP_AB puts
the weight tile on the MMA's M side (acc [BLOCK_N, BLOCK_M] = w @ x^T): on sm_90 a 64-row weight tile is
then a wgmma that reads float8 straight from shared memory, with no per-element work in registers. Where
x comes from (X_MODE):
    0  x in float, dynamic scales: each program first reads its rows once for max|x| (at most 16 rows of
       K, from L2), then quantizes each x tile as it goes (config FUSE_QUANT: one launch)
    1  x in float, the static input_scale: quantized as it goes
    2  x already float8 with per-row scales (fp8_quantize_rows: a launch of its own)
With PROLOGUE (fp8_prologue_matmul, modes 0 and 1) x is the input of skinny_matmul's prologues (rms_norm,
add_rms_norm, silu_mul, gelu_mul): each program computes their output tile by tile (mode 0: a first pass for
max |output|), add_rms_norm's column tile 0 stores h = x + residual, and the tiles are quantized as above.
At one row in a dot tile, where x is computed in the kernel (modes 0 and 1), the kernel normalises and
quantizes that row alone and broadcasts it to the tile's 16 rows (ROWS 1): computed for all 16 rows, the
prologue and its scale pass cost 10.3 ms a step against 3.2 without the prologue (H200, 2026-11-29, its first
GPU run). Mode 2 keeps loading a 16-row tile with the rows past M masked: its one loaded row selected into the
tile measured 3.48 ms of model time a step against 2.50 (the same day; the load no longer feeds the MMA
directly). The first passes over the row (mean square, max) step prepass_block's 4096 columns at one row.
Products: a tl.dot of two float8e4nv tiles (sm_89+; float16 copies elsewhere, exact), added to the
float32 accumulator once per K step (the Hopper fp8 MMA keeps about 14 bits while it sums within one);
one row: float32 multiply-add.

Where it rounds: x / x_scale is rounded once to float8 (a correctly rounded quotient, as torch divides);
the products of two float8 values are exact; sums in float32; then * x_scale * weight_scale, + bias, one
rounding to x's dtype (the reference's order; with SPLIT_K > 1 each split is scaled before the sum).
_scaled_mm's rows sum in the float8 MMA's accumulator throughout (FAST_ACCUM), as vLLM's do.
Under Triton's CPU interpreter the float32 -> float8 cast is wrong where rounding carries into the
exponent (triton 3.9: 31.08 -> 16), so the CPU tests feed values that float8 holds exactly.
"""

import torch
import triton
import triton.language as tl

from graphllm.kernels.fp8_convert import fp8_dots_on
from graphllm.kernels.gdc import dependent_start, weight_lines
from graphllm.kernels.int8_matmul import MAX_ROWS, decode_split_k, m_bucket, plan_launch, tile_ids
from graphllm.kernels.quant_layout import fp8_linear_reference, fp8_quantized_linear_reference  # noqa: F401 - oracles
from graphllm.kernels.launch import pdl_launch
from graphllm.kernels.skinny_matmul import PROLOGUES, _operand, _row_rstd, finish_tile

# (m_bucket, N, K) -> config: the best of benchmarks/quant_kernel_sweep.py on the H200, 2026-11-25
# (Llama-3-8B shapes; up to 16 rows from the fp8q sweep, x already float8, the path quantize_fp8_activations
# leaves); other shapes take default_config
CONFIGS: dict[tuple[int, int, int], dict] = {
    (1, 6144, 4096): {'BLOCK_M': 16, 'SWAP_AB': True, 'FUSE_QUANT': False, 'num_warps': 4, 'BLOCK_N': 64, 'BLOCK_K': 256, 'num_stages': 4, 'SPLIT_K': 1},
    (2, 6144, 4096): {'BLOCK_M': 16, 'SWAP_AB': True, 'FUSE_QUANT': False, 'num_warps': 4, 'BLOCK_N': 64, 'BLOCK_K': 256, 'num_stages': 4, 'SPLIT_K': 1},
    (4, 6144, 4096): {'BLOCK_M': 16, 'SWAP_AB': True, 'FUSE_QUANT': False, 'num_warps': 4, 'BLOCK_N': 64, 'BLOCK_K': 256, 'num_stages': 4, 'SPLIT_K': 1},
    (8, 6144, 4096): {'BLOCK_M': 16, 'SWAP_AB': True, 'FUSE_QUANT': False, 'num_warps': 4, 'BLOCK_N': 64, 'BLOCK_K': 256, 'num_stages': 4, 'SPLIT_K': 1},
    (16, 6144, 4096): {'BLOCK_M': 16, 'SWAP_AB': True, 'FUSE_QUANT': False, 'num_warps': 4, 'BLOCK_N': 64, 'BLOCK_K': 256, 'num_stages': 4, 'SPLIT_K': 1},
    (32, 6144, 4096): {'BLOCK_M': 32, 'BLOCK_N': 128, 'BLOCK_K': 128, 'SWAP_AB': True, 'GROUP_M': 8, 'FUSE_QUANT': False, 'num_warps': 4, 'num_stages': 4},
    (64, 6144, 4096): {'BLOCK_M': 32, 'BLOCK_N': 128, 'BLOCK_K': 128, 'SWAP_AB': True, 'GROUP_M': 8, 'FUSE_QUANT': False, 'num_warps': 4, 'num_stages': 4},
    (1, 4096, 4096): {'BLOCK_M': 16, 'SWAP_AB': True, 'FUSE_QUANT': False, 'num_warps': 4, 'BLOCK_N': 64, 'BLOCK_K': 256, 'num_stages': 4, 'SPLIT_K': 4},  # 8.3 us against 8.5 unsplit (qsweep-fp8q1, 2026-11-29)
    (2, 4096, 4096): {'BLOCK_M': 16, 'SWAP_AB': True, 'FUSE_QUANT': False, 'num_warps': 4, 'BLOCK_N': 64, 'BLOCK_K': 256, 'num_stages': 4, 'SPLIT_K': 1},
    (4, 4096, 4096): {'BLOCK_M': 16, 'SWAP_AB': True, 'FUSE_QUANT': False, 'num_warps': 4, 'BLOCK_N': 64, 'BLOCK_K': 256, 'num_stages': 4, 'SPLIT_K': 1},
    (8, 4096, 4096): {'BLOCK_M': 16, 'SWAP_AB': True, 'FUSE_QUANT': False, 'num_warps': 4, 'BLOCK_N': 64, 'BLOCK_K': 256, 'num_stages': 4, 'SPLIT_K': 1},
    (16, 4096, 4096): {'BLOCK_M': 16, 'SWAP_AB': True, 'FUSE_QUANT': False, 'num_warps': 4, 'BLOCK_N': 64, 'BLOCK_K': 256, 'num_stages': 4, 'SPLIT_K': 2},
    (32, 4096, 4096): {'BLOCK_M': 32, 'BLOCK_N': 128, 'BLOCK_K': 128, 'SWAP_AB': True, 'GROUP_M': 8, 'FUSE_QUANT': False, 'num_warps': 4, 'num_stages': 4},
    (64, 4096, 4096): {'BLOCK_M': 32, 'BLOCK_N': 128, 'BLOCK_K': 128, 'SWAP_AB': True, 'GROUP_M': 8, 'FUSE_QUANT': False, 'num_warps': 4, 'num_stages': 4},
    (1, 28672, 4096): {'BLOCK_M': 16, 'SWAP_AB': True, 'FUSE_QUANT': False, 'num_warps': 4, 'BLOCK_N': 64, 'BLOCK_K': 256, 'num_stages': 4, 'SPLIT_K': 1},
    (2, 28672, 4096): {'BLOCK_M': 16, 'SWAP_AB': True, 'FUSE_QUANT': False, 'num_warps': 4, 'BLOCK_N': 64, 'BLOCK_K': 256, 'num_stages': 4, 'SPLIT_K': 1},
    (4, 28672, 4096): {'BLOCK_M': 16, 'SWAP_AB': True, 'FUSE_QUANT': False, 'num_warps': 4, 'BLOCK_N': 64, 'BLOCK_K': 256, 'num_stages': 4, 'SPLIT_K': 1},
    (8, 28672, 4096): {'BLOCK_M': 16, 'SWAP_AB': True, 'FUSE_QUANT': False, 'num_warps': 4, 'BLOCK_N': 64, 'BLOCK_K': 256, 'num_stages': 4, 'SPLIT_K': 1},
    (16, 28672, 4096): {'BLOCK_M': 16, 'SWAP_AB': True, 'FUSE_QUANT': False, 'num_warps': 4, 'BLOCK_N': 64, 'BLOCK_K': 256, 'num_stages': 4, 'SPLIT_K': 1},
    (32, 28672, 4096): {'BLOCK_M': 32, 'BLOCK_N': 128, 'BLOCK_K': 128, 'SWAP_AB': True, 'GROUP_M': 8, 'FUSE_QUANT': False, 'num_warps': 4, 'num_stages': 4},
    (64, 28672, 4096): {'BLOCK_M': 64, 'BLOCK_N': 128, 'BLOCK_K': 128, 'SWAP_AB': False, 'GROUP_M': 8, 'FUSE_QUANT': False, 'num_warps': 4, 'num_stages': 4},
    (1, 4096, 14336): {'BLOCK_M': 16, 'SWAP_AB': True, 'FUSE_QUANT': False, 'num_warps': 4, 'BLOCK_N': 64, 'BLOCK_K': 256, 'num_stages': 4, 'SPLIT_K': 4},
    (2, 4096, 14336): {'BLOCK_M': 16, 'SWAP_AB': True, 'FUSE_QUANT': False, 'num_warps': 4, 'BLOCK_N': 64, 'BLOCK_K': 256, 'num_stages': 4, 'SPLIT_K': 4},
    (4, 4096, 14336): {'BLOCK_M': 16, 'SWAP_AB': True, 'FUSE_QUANT': False, 'num_warps': 4, 'BLOCK_N': 64, 'BLOCK_K': 256, 'num_stages': 4, 'SPLIT_K': 4},
    (8, 4096, 14336): {'BLOCK_M': 16, 'SWAP_AB': True, 'FUSE_QUANT': False, 'num_warps': 4, 'BLOCK_N': 64, 'BLOCK_K': 256, 'num_stages': 4, 'SPLIT_K': 4},
    (16, 4096, 14336): {'BLOCK_M': 16, 'SWAP_AB': True, 'FUSE_QUANT': False, 'num_warps': 4, 'BLOCK_N': 64, 'BLOCK_K': 256, 'num_stages': 4, 'SPLIT_K': 4},
    (1, 128256, 4096): {'BLOCK_M': 16, 'SWAP_AB': True, 'FUSE_QUANT': False, 'num_warps': 4, 'BLOCK_N': 64, 'BLOCK_K': 256, 'num_stages': 4, 'SPLIT_K': 1},  # 124.3 us against 139.7 without SWAP_AB (qsweep-fp8q1)
    (2, 128256, 4096): {'BLOCK_M': 16, 'BLOCK_N': 64, 'BLOCK_K': 256, 'FUSE_QUANT': False, 'num_warps': 4, 'num_stages': 4, 'SPLIT_K': 1},
    (4, 128256, 4096): {'BLOCK_M': 16, 'SWAP_AB': True, 'FUSE_QUANT': False, 'num_warps': 4, 'BLOCK_N': 64, 'BLOCK_K': 256, 'num_stages': 4, 'SPLIT_K': 1},
    (8, 128256, 4096): {'BLOCK_M': 16, 'SWAP_AB': True, 'FUSE_QUANT': False, 'num_warps': 4, 'BLOCK_N': 64, 'BLOCK_K': 256, 'num_stages': 4, 'SPLIT_K': 1},
    (16, 128256, 4096): {'BLOCK_M': 16, 'SWAP_AB': True, 'FUSE_QUANT': False, 'num_warps': 4, 'BLOCK_N': 64, 'BLOCK_K': 256, 'num_stages': 4, 'SPLIT_K': 1},
    (32, 128256, 4096): {'BLOCK_M': 32, 'BLOCK_N': 128, 'BLOCK_K': 128, 'SWAP_AB': True, 'GROUP_M': 8, 'FUSE_QUANT': False, 'num_warps': 4, 'num_stages': 4},
    (64, 128256, 4096): {'BLOCK_M': 64, 'BLOCK_N': 128, 'BLOCK_K': 128, 'SWAP_AB': False, 'GROUP_M': 8, 'FUSE_QUANT': False, 'num_warps': 4, 'num_stages': 4},
}
X_DYNAMIC, X_STATIC, X_QUANTIZED = 0, 1, 2
# _scaled_mm sums in the float8 MMA's own accumulator, not promoted to float32 every few K steps (vLLM's sm_90 fp8
# GEMMs do the same: CUTLASS's FP8FastAccum schedules): 10-17% off gate_up / qkv at 256-4,096 rows on an H100
# (benchmarks/fp8_gemm_large_m.py, 2026-12-06), its max error 5e-3..1.2e-2 of max |y| against 3e-3 promoted
FAST_ACCUM = True


@triton.jit
def _quantize(x, x_scale, x_inv):
    """x [R, C] in float, x_scale and x_inv = 1 / x_scale (correctly rounded) [R, 1] -> float8e4nv, as the
    reference rounds: x / x_scale correctly rounded (Markstein: the quotient x * x_inv corrected by one fma
    of its exact residual; div.rn costs a subroutine per element), clamped to +-448, rounded to float8."""
    xf = x.to(tl.float32)
    q = xf * x_inv
    q = tl.fma(tl.fma(-q, x_scale, xf), x_inv, q)
    return tl.minimum(tl.maximum(q, -448.0), 448.0).to(tl.float8e4nv)


@triton.jit
def _dot(a, b, FP8_DOT: tl.constexpr):
    """a @ b for float8e4nv tiles, float32 out; without fp8 tensor cores in float16 (exact for e4m3)."""
    if FP8_DOT:
        return tl.dot(a, b)
    else:
        return tl.dot(a.to(tl.float16), b.to(tl.float16))


@triton.jit
def _quantize_rows_kernel(x_ptr, input_scale_ptr, xq_ptr, x_scale_ptr, K, stride_xm,
                          STATIC: tl.constexpr, BLOCK_K: tl.constexpr):
    """One program per row: x_scale[row] (dynamic or the static one) and xq[row, :] float8."""
    row = tl.program_id(0)
    rows = row + tl.arange(0, 1)
    if STATIC:
        scale = tl.load(input_scale_ptr + tl.zeros([1, 1], dtype=tl.int32)).to(tl.float32)
    else:
        scale = _row_scales(x_ptr, x_ptr, x_ptr, tl.zeros([1, 1], dtype=tl.float32), rows, rows >= 0, K, stride_xm,
                            0, 1, BLOCK_K, 0, False)
    inv = tl.math.div_rn(1.0, scale)
    tl.store(x_scale_ptr + rows[:, None], scale)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)[None, :]
        x = tl.load(x_ptr + row * stride_xm + k, mask=k < K, other=0.0)
        tl.store(xq_ptr + row * K + k, _quantize(x, scale, inv), mask=k < K)


@triton.jit
def _row_scales(x_ptr, res_ptr, norm_w_ptr, rstd, offs_m, m_mask, K, stride_xm, stride_rm,
                BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, PROLOGUE: tl.constexpr, UNIT_OFFSET: tl.constexpr):
    """max(max|a_row| / FP8_MAX, MIN_SCALE) (quant_layout's 448 and 1e-12) for rows offs_m: [BLOCK_M, 1] float32,
    a = x (PROLOGUE 0) or the prologue's output (skinny_matmul._operand, which rounds as the eager ops do),
    computed from x (and residual) without storing anything."""
    amax = tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        a = _operand(x_ptr, res_ptr, norm_w_ptr, x_ptr, rstd, offs_m, k, m_mask[:, None] & (k < K)[None, :], K,
                     stride_xm, stride_rm, 0, PROLOGUE, UNIT_OFFSET)  # residual_rows 0: no row is written
        amax = tl.maximum(amax, tl.abs(a.to(tl.float32)))
    return tl.maximum(tl.math.div_rn(tl.max(amax, 1), 448.0), 1e-12)[:, None]


@triton.jit(do_not_specialize=["M", "eps"])  # every row count shares one compile per tile shape
def _fp8_matmul_kernel(x_ptr, x_scale_ptr, w_ptr, w_scale_ptr, bias_ptr, out_ptr, partial_ptr, count_ptr,
                       res_ptr, norm_w_ptr, new_res_ptr,
                       M, N, K, K_SPLIT, stride_xm, stride_wn, stride_om, stride_rm, eps,
                       X_MODE: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, GROUP_M: tl.constexpr, SWAP_AB: tl.constexpr,
                       EVEN_N: tl.constexpr, EVEN_K: tl.constexpr, FP8_DOT: tl.constexpr,
                       PROLOGUE: tl.constexpr, UNIT_OFFSET: tl.constexpr, ROWS: tl.constexpr, PRE_K: tl.constexpr,
                       PDL: tl.constexpr = False):
    pid_m, pid_n = tile_ids(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    pid_k = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    n_mask = offs_n < N
    # the rows of x read, normalised, scaled and quantized: ROWS (1 for one row, else the tile's), so that a
    # 16-row tile at one row does not run the prologue and the quantization for 15 masked rows
    offs_x = pid_m * BLOCK_M + tl.arange(0, ROWS)
    x_mask = offs_x < M
    k_lo = pid_k * K_SPLIT
    k_hi = tl.minimum(k_lo + K_SPLIT, K)
    if PDL:  # programmatic dependent launch (launch.py): nothing the kernels before write is touched before this
        dependent_start(weight_lines(w_ptr, offs_n, N, k_lo, stride_wn, BLOCK_K))
    rstd = tl.zeros([ROWS, 1], dtype=tl.float32)
    if PROLOGUE == 1 or PROLOGUE == 2:  # the norms: 1 / rms of each row of h = x (+ residual)
        rstd = _row_rstd(x_ptr, res_ptr, offs_x, x_mask, K, eps, stride_xm, stride_rm, ROWS, PRE_K, PROLOGUE)
    residual_rows = M - M * tl.minimum(pid_n, 1)  # column tile 0 writes the new residual (add_rms_norm)
    if X_MODE == 0:
        x_scale = _row_scales(x_ptr, res_ptr, norm_w_ptr, rstd, offs_x, x_mask, K, stride_xm, stride_rm,
                              ROWS, PRE_K, PROLOGUE, UNIT_OFFSET)  # [ROWS, 1]
    elif X_MODE == 1:
        x_scale = tl.load(x_scale_ptr + tl.zeros([ROWS, 1], dtype=tl.int32)).to(tl.float32)
    else:
        x_scale = tl.load(x_scale_ptr + offs_x, mask=x_mask, other=1.0)[:, None]
    x_inv = tl.math.div_rn(1.0, x_scale)
    x_ptrs = x_ptr + offs_x[:, None] * stride_xm + (k_lo + offs_k)[None, :]  # [ROWS, BLOCK_K]
    w_ptrs = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn + (k_lo + offs_k)[None, :]  # [BLOCK_N, BLOCK_K]
    if BLOCK_M == 1:
        acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    elif SWAP_AB:
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        if EVEN_K:
            mk_mask = x_mask[:, None]
            if EVEN_N:
                w = tl.load(w_ptrs)
            else:
                w = tl.load(w_ptrs, mask=n_mask[:, None], other=0.0)
        else:
            k_mask = (k0 + offs_k) < k_hi
            mk_mask = x_mask[:, None] & k_mask[None, :]
            w = tl.load(w_ptrs, mask=n_mask[:, None] & k_mask[None, :], other=0.0)
        if PROLOGUE != 0:  # the prologue's output for these columns (add_rms_norm: h stored by column tile 0)
            x = _operand(x_ptr, res_ptr, norm_w_ptr, new_res_ptr, rstd, offs_x, k0 + offs_k, mk_mask, K, stride_xm,
                         stride_rm, residual_rows, PROLOGUE, UNIT_OFFSET)
        else:
            x = tl.load(x_ptrs, mask=mk_mask, other=0.0)
        if X_MODE != 2:
            x = _quantize(x, x_scale, x_inv)
        if ROWS < BLOCK_M:  # one row in a dot tile: every row holds it (rows past M are neither stored nor summed)
            x = tl.broadcast_to(x, (BLOCK_M, BLOCK_K))
        # a fresh float32 sum per K step: the Hopper fp8 MMA accumulates in reduced precision within one
        if BLOCK_M == 1:
            acc += w.to(tl.float32) * x.to(tl.float32)  # [BLOCK_N, BLOCK_K] * [1, BLOCK_K]
        elif SWAP_AB:
            acc += _dot(w, tl.trans(x), FP8_DOT)  # [BLOCK_N, BLOCK_M]: the weight tile feeds the MMA's M side
        else:
            acc += _dot(x, tl.trans(w), FP8_DOT)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if BLOCK_M == 1:
        acc = tl.sum(acc, 1)[None, :]  # [1, BLOCK_N]
    elif SWAP_AB:
        acc = tl.trans(acc)
    out = acc * x_scale * tl.load(w_scale_ptr + offs_n, mask=n_mask, other=0.0)[None, :]
    finish_tile(out, bias_ptr, out_ptr, partial_ptr, count_ptr, pid_n, pid_k, offs_m, offs_n, m_mask, n_mask, N,
                stride_om, HAS_BIAS, BLOCK_M, BLOCK_N, SPLIT_K)


def default_config(m: int, n: int, k: int, device: torch.device) -> dict:
    """Measured configs first (CONFIGS), else (unmeasured guesses): up to 16 rows in one 16-row tile of
    [64, 256] weight tiles, the weight on the MMA's M side (SWAP_AB: on sm_90 a wgmma streaming float8
    straight from shared memory), x quantized in the kernel, decode_split_k's K splits; more rows (where
    _scaled_mm cannot take them) in 128 x 128 GEMM tiles over x quantized beforehand."""
    if (m_bucket(m), n, k) in CONFIGS:
        return CONFIGS[(m_bucket(m), n, k)]
    if m <= MAX_ROWS:
        return {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 256, "SWAP_AB": True, "FUSE_QUANT": True,
                "num_warps": 4, "num_stages": 4, "SPLIT_K": decode_split_k(n, k, 64, 256, device)}
    return {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 8, "FUSE_QUANT": False,
            "num_warps": 8, "num_stages": 3}


def prepass_block(rows: int, block_k: int, k: int) -> int:
    """The K width of the kernel's first passes over its rows (a norm prologue's mean square, the dynamic scale's
    max): at one row up to 4096 columns a step, one or a few L2 round trips where BLOCK_K's 8-56 steps each
    waited before the weight stream could start (the fp8 prologue: 244.8 -> 282.2 tok/s at batch 1, H200,
    2026-11-29), else BLOCK_K (a [16, 4096] tile would not fit the registers)."""
    return min(triton.next_power_of_2(k), 4096) if rows == 1 else block_k


def fp8_quantize_rows(x: torch.Tensor, input_scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (float8_e4m3fn [M, K] contiguous, float32 x_scale [M]): quant_layout.quantize_fp8_rows
    in one launch (one program per row), the scale per row or input_scale for every row."""
    m, k = x.shape
    assert x.stride(-1) == 1
    xq = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=x.device)
    x_scale = torch.empty((m,), dtype=torch.float32, device=x.device)
    if m:
        _quantize_rows_kernel[(m,)](x, x_scale if input_scale is None else input_scale, xq, x_scale, k, x.stride(0),
                                    STATIC=input_scale is not None, BLOCK_K=min(2048, triton.next_power_of_2(k)),
                                    num_warps=4)
    return xq, x_scale


def takes_scaled_mm(m: int) -> bool:
    """Rows past the small-M tiles go to torch._scaled_mm (where no measured config says otherwise)."""
    return m > MAX_ROWS


def scaled_mm_takes(out_dtype: torch.dtype, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """torch._scaled_mm with row-wise scales serves this product: bfloat16 out (the output every torch
    build's row-wise path gives), bias absent or bfloat16, N and K multiples of 16, an sm_89+ GPU."""
    n, k = weight.shape
    return (weight.is_cuda and out_dtype == torch.bfloat16 and (bias is None or bias.dtype == torch.bfloat16)
            and n % 16 == 0 and k % 16 == 0 and torch.cuda.get_device_capability(weight.device) >= (8, 9))


def fp8_matmul(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
               input_scale: torch.Tensor | None = None, bias: torch.Tensor | None = None,
               config: dict | None = None) -> torch.Tensor:
    """fp8_linear_reference(x, weight, weight_scale, input_scale, bias) for x: [M, K] (last-dim stride 1),
    weight: float8_e4m3fn [N, K] contiguous, weight_scale: float32 [N], input_scale: float32 [1] or None,
    bias: [N] or None -> a new contiguous [M, N] in x's dtype. config: default_config's keys; a config (given,
    or CONFIGS') also keeps more than MAX_ROWS rows off _scaled_mm."""
    m, k = x.shape
    _check_weight(weight, weight_scale, k)
    assert x.stride(-1) == 1
    config = config or CONFIGS.get((m_bucket(m), weight.shape[0], k))
    quantize_first = config is None and takes_scaled_mm(m) and scaled_mm_takes(x.dtype, weight, bias)
    if not quantize_first and m:
        config = config or default_config(m, weight.shape[0], k, x.device)
        quantize_first = input_scale is None and not config.get("FUSE_QUANT")
    if quantize_first:
        xq, x_scale = fp8_quantize_rows(x, input_scale)
        return fp8_matmul_quantized(xq, x_scale, weight, weight_scale, bias, x.dtype, config)
    mode = X_STATIC if input_scale is not None else X_DYNAMIC
    return _launch(x, weight_scale if input_scale is None else input_scale, mode, weight, weight_scale, bias,
                   x.dtype, config)


def fp8_matmul_quantized(xq: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                         bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16,
                         config: dict | None = None) -> torch.Tensor:
    """fp8_quantized_linear_reference for x already in float8: xq [M, K] (last-dim stride 1) with float32
    x_scale [M] -> a new contiguous [M, N] in out_dtype; the dot tiles (X_MODE 2) up to MAX_ROWS rows or where
    a config is measured, else row-wise torch._scaled_mm (where it serves the product)."""
    m, k = xq.shape
    _check_weight(weight, weight_scale, k)
    assert xq.dtype == torch.float8_e4m3fn and xq.stride(-1) == 1 and x_scale.shape == (m,)
    config = config or CONFIGS.get((m_bucket(m), weight.shape[0], k))
    if config is None and takes_scaled_mm(m) and scaled_mm_takes(out_dtype, weight, bias):
        n = weight.shape[0]
        return torch._scaled_mm(xq, weight.t(), scale_a=x_scale.view(m, 1), scale_b=weight_scale.view(1, n),
                                bias=bias, out_dtype=out_dtype, use_fast_accum=FAST_ACCUM)
    return _launch(xq, x_scale, X_QUANTIZED, weight, weight_scale, bias, out_dtype,
                   config or default_config(m, weight.shape[0], k, xq.device))


def _check_weight(weight: torch.Tensor, weight_scale: torch.Tensor, k: int) -> None:
    n = weight.shape[0]
    assert weight.dtype == torch.float8_e4m3fn and weight.shape == (n, k) and weight.is_contiguous()
    assert weight_scale.shape == (n,) and weight_scale.dtype == torch.float32


def _launch(x: torch.Tensor, x_scale: torch.Tensor, mode: int, weight: torch.Tensor, weight_scale: torch.Tensor,
            bias: torch.Tensor | None, out_dtype: torch.dtype, config: dict, prologue: str = "none",
            residual: torch.Tensor | None = None, norm_weight: torch.Tensor | None = None,
            new_residual: torch.Tensor | None = None, eps: float = 0.0, unit_offset: bool = False) -> torch.Tensor:
    """One _fp8_matmul_kernel launch (with its K-split plan) over x in the given X_MODE, x being the prologue's
    input where one is named (fp8_prologue_matmul)."""
    m = x.shape[0]
    n, k = weight.shape
    out = torch.empty((m, n), dtype=out_dtype, device=x.device)
    if m == 0:
        return out
    plan = plan_launch(m, n, k, config, x.device)
    rows = 1 if m == 1 and mode != X_QUANTIZED else plan.block_m  # the kernel's ROWS
    _fp8_matmul_kernel[plan.grid](
        x, x_scale, weight, weight_scale, weight_scale if bias is None else bias,
        out, out if plan.partial is None else plan.partial, out if plan.counters is None else plan.counters,
        x if residual is None else residual, x if norm_weight is None else norm_weight,
        out if new_residual is None else new_residual,
        m, n, k, plan.k_split, x.stride(0), weight.stride(0), out.stride(0),
        0 if residual is None else residual.stride(0), eps,
        X_MODE=mode, HAS_BIAS=bias is not None, BLOCK_M=plan.block_m, BLOCK_N=config["BLOCK_N"],
        BLOCK_K=plan.block_k, SPLIT_K=plan.split_k, GROUP_M=config.get("GROUP_M", 8),
        SWAP_AB=config.get("SWAP_AB", False), EVEN_N=n % config["BLOCK_N"] == 0,
        EVEN_K=plan.k_split * plan.split_k == k, FP8_DOT=fp8_dots_on(x.device), PROLOGUE=PROLOGUES[prologue],
        UNIT_OFFSET=unit_offset, ROWS=rows, PRE_K=prepass_block(rows, plan.block_k, k), num_warps=config["num_warps"],
        num_stages=config["num_stages"], **(pdl_launch(x.device) if m <= MAX_ROWS else {}))
    return out


def fp8_prologue_matmul(prologue: str, x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                        input_scale: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                        residual: torch.Tensor | None = None, norm_weight: torch.Tensor | None = None,
                        eps: float = 0.0, unit_offset: bool = False,
                        config: dict | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """fp8_matmul of a prologue's output, in one launch, for up to MAX_ROWS rows: the kernel computes the prologue
    (skinny_matmul's: rms_norm, add_rms_norm, silu_mul, gelu_mul, rounded as the eager ops round), its row scale
    (dynamic: a first pass over the rows for max |operand|; or input_scale) and the float8 operand as it goes,
    so W8A8 computes what fp8_linear_reference(prologue(x)) does. x: [M, K] ([M, 2K] for the activations),
    residual: [M, K] for add_rms_norm. Returns (y [M, N] in x's dtype, h = x + residual as a new [M, K] for
    add_rms_norm, else None)."""
    m = x.shape[0]
    n, k = weight.shape
    _check_weight(weight, weight_scale, k)
    assert m <= MAX_ROWS and x.stride(-1) == 1 and prologue in PROLOGUES and prologue != "none"
    assert x.shape[1] == (2 * k if prologue in ("silu_mul", "gelu_mul") else k), (prologue, x.shape, weight.shape)
    new_residual = None
    if prologue == "add_rms_norm":
        assert residual is not None and residual.shape == x.shape and residual.stride(-1) == 1
        new_residual = x.new_empty((m, k))
    config = config or CONFIGS.get((m_bucket(m), n, k)) or default_config(m, n, k, x.device)
    mode = X_STATIC if input_scale is not None else X_DYNAMIC
    out = _launch(x, weight_scale if input_scale is None else input_scale, mode, weight, weight_scale, bias, x.dtype,
                  config, prologue, residual, norm_weight, new_residual, eps, unit_offset)
    return out, new_residual
