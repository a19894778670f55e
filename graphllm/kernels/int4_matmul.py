"""y = x @ W^T (+ bias) for a weight-only int4 linear (GPTQ packing), W dequantized in registers: one Triton kernel.

    x [M, K] float16 / bfloat16 / float32 (last-dim stride 1), qweight int32 [K/8, N], scales [K/G, N],
    zeros [K/G, N] (all contiguous; zeros whole numbers 0..15), bias [N] or None  ->  y [M, N] in x's dtype
    W[n, k] = (q[k, n] - zeros[k // G, n]) * scales[k // G, n],  q[8r + j, n] = nibble j of qweight[r, n]
    (quant_layout; int4_linear_reference is the oracle)

The weight is streamed once whatever M is (Marlin's idea): grid (tiles_m * tiles_n, SPLIT_K), and at
decode sizes one 16-row dot tile serves 1..16 rows, so the time is flat in M up to 16. A K step loads
words [BLOCK_K/8, BLOCK_N] (coalesced along N) and takes them apart nibble by nibble: nibble j of word
row r is row 8r + j of W, so step j pairs W's rows {8r + j} with x's columns {k0 + 8r + j} (strided
loads of x, which is small and cached), and no reshape of the words is needed:

    BLOCK_M == 1:   acc[BLOCK_K/8, BLOCK_N] += W_j * x_j[:, None]   (float32 multiply-add), one sum at the end
    BLOCK_M >= 16:  acc[BLOCK_M, BLOCK_N] += x_j @ W_j              (tl.dot, 8 per K step, BLOCK_K >= 128)

A nibble becomes a float without a conversion instruction (I2F runs at a quarter rate): 0x4B000000 | q
read as float32 is 2^23 + q, and subtracting 2^23 + z leaves q - z exactly. Scales and zeros are loaded
once per K step as [1, BLOCK_N] where the step lies in one group (ONE_GROUP: G % BLOCK_K == 0, e.g. G =
128 with BLOCK_K = 128), else per word row, [BLOCK_K/8, BLOCK_N] (a word's 8 rows share a group).

Rows past 16 (prefill) take GEMM tiles of the same kernel (BLOCK_M 32..128, GROUP_M row tiles grouped,
no K split): the weight is dequantized per tile in registers. A dequantize-to-bf16 + cuBLAS path would
write and then read a bf16 copy of W on every call: 4 bytes of traffic per weight element against half
a byte, 30 GB per step of an 8B model (10 ms at 3 TB/s) before cuBLAS computes anything.
benchmarks/quant_kernel_sweep.py times the Triton GEMM beside bf16 cuBLAS at 32..256 rows. SPLIT_K > 1
reduces as skinny_matmul does (finish_tile).

Where it rounds:
- one row: W = (q - z) * s is exact in float32 (a 4-bit integer times a 16-bit float); with ONE_GROUP
  each step's sum of (q - z) * x is scaled instead (exact products). Sums in float32: the reference up
  to float32 rounding.
- dot tiles, ONE_GROUP: (q - z) is exact in x's dtype; the dot sums x * (q - z) in float32 and the
  group's scale multiplies each step's sum: again the reference up to float32 rounding.
- dot tiles, a K step spanning groups (G < BLOCK_K): W = (q - z) * s rounded once to x's dtype (relative
  2^-8 in bfloat16, 2^-11 in float16) before the dot, as a dequantize-then-cuBLAS path would (weight_rounds).
Then + bias and one rounding to x's dtype.
"""

import torch
import triton
import triton.language as tl

from graphllm.kernels.int8_matmul import (MAX_ROWS, decode_split_k, dot_precision, m_bucket, plan_launch,
                                          tile_ids, tile_shape)
from graphllm.kernels.quant_layout import INT4_PACK, check_int4_shape, int4_linear_reference  # noqa: F401
from graphllm.kernels.skinny_matmul import finish_tile

CONFIGS: dict[tuple[int, int, int], dict] = {}  # (m_bucket, N, K) -> config, pasted from the sweep
DOT_MIN_BLOCK_K = 128  # 8 dots per K step, each over BLOCK_K / 8 >= 16 rows


@triton.jit
def _group_params(scales_ptr, zeros_ptr, k0, offs_r, r_mask, offs_n, n_mask, N, G, ONE_GROUP: tl.constexpr):
    """(2^23 + z, s) as float32 for the words of a K step: [1, BLOCK_N] when the step lies in one group,
    else [BLOCK_K/8, BLOCK_N] (the 8 rows of a word share a group: G is a multiple of 8)."""
    if ONE_GROUP:
        offs = (k0 // G) * N + offs_n[None, :]
        mask = n_mask[None, :]
    else:
        offs = ((k0 + 8 * offs_r) // G)[:, None] * N + offs_n[None, :]
        mask = r_mask[:, None] & n_mask[None, :]
    z = tl.load(zeros_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    s = tl.load(scales_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    return z + 8388608.0, s


@triton.jit
def _nibble(words, zm, j: tl.constexpr):
    """q - z for nibble j of words, exactly, as float32 (0x4B000000 | q is 2^23 + q as float32)."""
    q = ((words.to(tl.uint32, bitcast=True) >> (4 * j)) & 0xF) | 0x4B000000
    return q.to(tl.float32, bitcast=True) - zm


@triton.jit(do_not_specialize=["M"])  # every row count shares one compile per tile shape
def _int4_matmul_kernel(x_ptr, qw_ptr, scales_ptr, zeros_ptr, bias_ptr, out_ptr, partial_ptr, count_ptr,
                        M, N, K, K_SPLIT, G, stride_xm, stride_om,
                        HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        SPLIT_K: tl.constexpr, GROUP_M: tl.constexpr, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr,
                        ONE_GROUP: tl.constexpr, PRECISION: tl.constexpr):
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
        x_ptrs = x_ptr + pid_m * stride_xm + (k_lo + 8 * offs_r)[:, None]  # [BLOCK_K/8, 1]: nibble 0's columns
        acc = tl.zeros([BLOCK_K // 8, BLOCK_N], dtype=tl.float32)
    else:
        x_ptrs = x_ptr + offs_m[:, None] * stride_xm + (k_lo + 8 * offs_r)[None, :]  # [BLOCK_M, BLOCK_K/8]
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        r_mask = (k0 + 8 * offs_r) < k_hi
        if EVEN_K and EVEN_N:
            words = tl.load(w_ptrs)
        else:
            words = tl.load(w_ptrs, mask=r_mask[:, None] & n_mask[None, :], other=0)
        zm, s = _group_params(scales_ptr, zeros_ptr, k0, offs_r, r_mask, offs_n, n_mask, N, G, ONE_GROUP)
        if BLOCK_M == 1:
            x_mask = r_mask[:, None] & m_mask[None, :]  # [BLOCK_K/8, 1]
            if ONE_GROUP:
                part = tl.zeros([BLOCK_K // 8, BLOCK_N], dtype=tl.float32)
                for j in tl.static_range(8):
                    x_j = tl.load(x_ptrs + j, mask=x_mask, other=0.0).to(tl.float32)  # [BLOCK_K/8, 1]
                    part += _nibble(words, zm, j) * x_j
                acc += part * s  # the group's scale, [1, BLOCK_N]
            else:
                for j in tl.static_range(8):
                    x_j = tl.load(x_ptrs + j, mask=x_mask, other=0.0).to(tl.float32)
                    acc += (_nibble(words, zm, j) * s) * x_j
        else:
            x_mask = m_mask[:, None] & r_mask[None, :]
            if ONE_GROUP:
                part = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
                for j in tl.static_range(8):
                    x_j = tl.load(x_ptrs + j, mask=x_mask, other=0.0)  # [BLOCK_M, BLOCK_K/8]
                    part = tl.dot(x_j, _nibble(words, zm, j).to(x_j.dtype), part, input_precision=PRECISION)
                acc += part * s  # the group's scale, [1, BLOCK_N]
            else:
                for j in tl.static_range(8):
                    x_j = tl.load(x_ptrs + j, mask=x_mask, other=0.0)
                    w_j = (_nibble(words, zm, j) * s).to(x_j.dtype)  # rounds W to x's dtype
                    acc = tl.dot(x_j, w_j, acc, input_precision=PRECISION)
        w_ptrs += (BLOCK_K // 8) * N
        x_ptrs += BLOCK_K
    if BLOCK_M == 1:
        acc = tl.sum(acc, 0)[None, :]  # [1, BLOCK_N]
    finish_tile(acc, bias_ptr, out_ptr, partial_ptr, count_ptr, pid_n, pid_k, offs_m, offs_n, m_mask, n_mask, N,
                stride_om, HAS_BIAS, BLOCK_M, BLOCK_N, SPLIT_K)


def default_config(m: int, n: int, k: int, device: torch.device) -> dict:
    """Measured configs first (CONFIGS), else (unmeasured guesses): one row in [128, 64] multiply-add tiles
    (4 KB of words per program and step; 64 columns to 4 warps keeps x's broadcast in shuffles), 2..16
    rows in one 16-row dot tile of [128, 64] (one group of 128 per step), both with decode_split_k's K
    splits; more rows in 64 x 128 GEMM tiles."""
    if (m_bucket(m), n, k) in CONFIGS:
        return CONFIGS[(m_bucket(m), n, k)]
    if m <= MAX_ROWS:
        return {"BLOCK_M": 1 if m == 1 else 16, "BLOCK_N": 64, "BLOCK_K": 128, "num_warps": 4,
                "num_stages": 3 if m == 1 else 4, "SPLIT_K": decode_split_k(n, k, 64, 128, device)}
    return {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 8, "num_warps": 8, "num_stages": 3}


def weight_rounds(m: int, k: int, group_size: int, config: dict) -> bool:
    """Whether int4_matmul rounds the dequantized weight to x's dtype (module docstring): dot tiles whose
    K step spans groups."""
    block_m, block_k = tile_shape(m, k, config, DOT_MIN_BLOCK_K)
    return block_m > 1 and group_size % block_k != 0


def int4_matmul(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                bias: torch.Tensor | None = None, config: dict | None = None) -> torch.Tensor:
    """int4_linear_reference(x, qweight, scales, zeros, bias) for x: [M, K] (last-dim stride 1), qweight:
    int32 [K/8, N], scales and zeros: [K/G, N] (all contiguous), bias: [N] or None -> a new contiguous
    [M, N] in x's dtype. config: default_config's keys (BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, GROUP_M,
    num_warps, num_stages); dot tiles (BLOCK_M > 1) take BLOCK_K >= 128."""
    m, k = x.shape
    n = qweight.shape[1]
    group_size = k // scales.shape[0]
    check_int4_shape(n, k, group_size)
    assert qweight.dtype == torch.int32 and qweight.shape == (k // INT4_PACK, n) and x.stride(-1) == 1
    assert scales.shape == zeros.shape == (k // group_size, n)
    assert qweight.is_contiguous() and scales.is_contiguous() and zeros.is_contiguous()
    out = x.new_empty((m, n))
    if m == 0:
        return out
    config = config or default_config(m, n, k, x.device)
    plan = plan_launch(m, n, k, config, x.device, DOT_MIN_BLOCK_K)
    _int4_matmul_kernel[plan.grid](
        x, qweight, scales, zeros, scales if bias is None else bias, out,
        out if plan.partial is None else plan.partial, out if plan.counters is None else plan.counters,
        m, n, k, plan.k_split, group_size, x.stride(0), out.stride(0),
        HAS_BIAS=bias is not None, BLOCK_M=plan.block_m, BLOCK_N=config["BLOCK_N"], BLOCK_K=plan.block_k,
        SPLIT_K=plan.split_k, GROUP_M=config.get("GROUP_M", 8), EVEN_N=n % config["BLOCK_N"] == 0,
        EVEN_K=plan.k_split * plan.split_k == k, ONE_GROUP=group_size % plan.block_k == 0,
        PRECISION=dot_precision(x.dtype), num_warps=config["num_warps"], num_stages=config["num_stages"])
    return out
