"""y = x @ W^T (+ bias) for a weight-only int8 linear, W dequantized in registers: one Triton kernel.

    x [M, K] float16 / bfloat16 / float32 (last-dim stride 1), weight int8 [N, K] (contiguous),
    weight_scale float32 [N], bias [N] or None  ->  y [M, N] in x's dtype
    W[n, k] = weight[n, k] * weight_scale[n]      (quant_layout; int8_linear_reference is the oracle)

The int8 sibling of skinny_matmul: at decode batch sizes the linear only streams its weight, now one
byte per element. Grid (tiles_m * tiles_n, SPLIT_K); program (t, s) walks its share of K in BLOCK_K
steps over a [BLOCK_N, BLOCK_K] weight tile:

    BLOCK_M == 1 (one row):  acc[BLOCK_N, BLOCK_K] += float(w) * float(x), one sum at the end
    BLOCK_M >= 16:           acc[BLOCK_M, BLOCK_N] += x @ w^T      (tl.dot, w as x's dtype, M padded)
      SWAP_AB:               acc[BLOCK_N, BLOCK_M] += w @ x^T      (the weight on the MMA's M side: a
                                                                    wgmma on sm_90 from BLOCK_N = 64)

int8 -> float32 takes no conversion instruction in the one-row path (a quarter-rate I2F per element
would cap it below an H200's bandwidth): 0x4B400000 + w read as float32 is 1.5 * 2^23 + w.

Rows: one row takes BLOCK_M 1 or 16, 2..16 rows one 16-row tile, more rows GEMM tiles (BLOCK_M 32..128)
grouped GROUP_M row tiles at a time (a group's weight tiles come from HBM once, then from L2). SPLIT_K >
1 (only where one M tile holds every row) reduces in-kernel as skinny_matmul does (finish_tile).

Where it rounds: nowhere before the output. An int8 value is exact in float16 / bfloat16 / float32, so
the products x * w are exact (tensor cores, or float32 multiply-add) and sum in float32; the per-channel
scale multiplies the float32 sum, then bias, then one rounding to x's dtype: int8_linear_reference's
order, so the two differ only by float32 summation order.

Configs: CONFIGS[(m_bucket(m), N, K)] where measured (benchmarks/quant_kernel_sweep.py), else
default_config's guess; no autotuning. This module also holds what the three quantized kernels
(int8_matmul, fp8_matmul, int4_matmul) share: tile_ids, m_bucket, decode_split_k, tile_shape, plan_launch.
"""

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from graphllm.kernels.quant_layout import int8_linear_reference  # noqa: F401 - the oracle of the tests
from graphllm.kernels.skinny_matmul import MAX_COLUMN_TILES, finish_tile, split_k_counters

MAX_ROWS = 16  # decode rows: one M tile of 16 (or 1); more rows take GEMM tiles
M_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)  # rows are looked up at the next bucket up
# (m_bucket, N, K) -> config: the best of benchmarks/quant_kernel_sweep.py on the H200, 2026-11-25
# (Llama-3-8B shapes), up to 16 rows (past that graphllm.int8_linear dequantizes for cuBLAS); other
# shapes take default_config
CONFIGS: dict[tuple[int, int, int], dict] = {
    (1, 6144, 4096): {'BLOCK_M': 16, 'BLOCK_N': 64, 'BLOCK_K': 128, 'SWAP_AB': False, 'num_warps': 4, 'num_stages': 4, 'SPLIT_K': 4},
    (2, 6144, 4096): {'BLOCK_M': 16, 'BLOCK_N': 64, 'BLOCK_K': 128, 'SWAP_AB': False, 'num_warps': 4, 'num_stages': 4, 'SPLIT_K': 4},
    (4, 6144, 4096): {'BLOCK_M': 16, 'BLOCK_N': 64, 'BLOCK_K': 128, 'SWAP_AB': False, 'num_warps': 4, 'num_stages': 4, 'SPLIT_K': 4},
    (8, 6144, 4096): {'BLOCK_M': 16, 'BLOCK_N': 64, 'BLOCK_K': 128, 'SWAP_AB': False, 'num_warps': 4, 'num_stages': 4, 'SPLIT_K': 4},
    (16, 6144, 4096): {'BLOCK_M': 16, 'BLOCK_N': 64, 'BLOCK_K': 128, 'SWAP_AB': False, 'num_warps': 4, 'num_stages': 4, 'SPLIT_K': 4},
    (1, 4096, 4096): {'BLOCK_M': 16, 'BLOCK_N': 64, 'BLOCK_K': 128, 'SWAP_AB': False, 'num_warps': 4, 'num_stages': 4, 'SPLIT_K': 4},
    (2, 4096, 4096): {'BLOCK_M': 16, 'BLOCK_N': 64, 'BLOCK_K': 128, 'SWAP_AB': False, 'num_warps': 4, 'num_stages': 4, 'SPLIT_K': 4},
    (4, 4096, 4096): {'BLOCK_M': 16, 'BLOCK_N': 64, 'BLOCK_K': 128, 'SWAP_AB': False, 'num_warps': 4, 'num_stages': 4, 'SPLIT_K': 4},
    (8, 4096, 4096): {'BLOCK_M': 16, 'BLOCK_N': 64, 'BLOCK_K': 128, 'SWAP_AB': False, 'num_warps': 4, 'num_stages': 4, 'SPLIT_K': 4},
    (16, 4096, 4096): {'BLOCK_M': 16, 'BLOCK_N': 64, 'BLOCK_K': 128, 'SWAP_AB': False, 'num_warps': 4, 'num_stages': 4, 'SPLIT_K': 4},
    (1, 28672, 4096): {'BLOCK_M': 16, 'BLOCK_N': 64, 'BLOCK_K': 128, 'SWAP_AB': False, 'num_warps': 4, 'num_stages': 4, 'SPLIT_K': 1},
    (2, 28672, 4096): {'BLOCK_M': 16, 'BLOCK_N': 64, 'BLOCK_K': 128, 'SWAP_AB': False, 'num_warps': 4, 'num_stages': 4, 'SPLIT_K': 1},
    (4, 28672, 4096): {'BLOCK_M': 16, 'BLOCK_N': 64, 'BLOCK_K': 128, 'SWAP_AB': False, 'num_warps': 4, 'num_stages': 4, 'SPLIT_K': 1},
    (8, 28672, 4096): {'BLOCK_M': 16, 'BLOCK_N': 64, 'BLOCK_K': 128, 'SWAP_AB': False, 'num_warps': 4, 'num_stages': 4, 'SPLIT_K': 1},
    (16, 28672, 4096): {'BLOCK_M': 16, 'BLOCK_N': 64, 'BLOCK_K': 128, 'SWAP_AB': False, 'num_warps': 4, 'num_stages': 4, 'SPLIT_K': 1},
    (1, 4096, 14336): {'BLOCK_M': 16, 'BLOCK_N': 64, 'BLOCK_K': 256, 'SWAP_AB': False, 'num_warps': 4, 'num_stages': 4, 'SPLIT_K': 4},
    (2, 4096, 14336): {'BLOCK_M': 16, 'BLOCK_N': 64, 'BLOCK_K': 256, 'SWAP_AB': False, 'num_warps': 4, 'num_stages': 4, 'SPLIT_K': 4},
    (4, 4096, 14336): {'BLOCK_M': 16, 'BLOCK_N': 64, 'BLOCK_K': 256, 'SWAP_AB': False, 'num_warps': 4, 'num_stages': 4, 'SPLIT_K': 4},
    (8, 4096, 14336): {'BLOCK_M': 16, 'BLOCK_N': 64, 'BLOCK_K': 256, 'SWAP_AB': False, 'num_warps': 4, 'num_stages': 4, 'SPLIT_K': 4},
    (16, 4096, 14336): {'BLOCK_M': 16, 'BLOCK_N': 64, 'BLOCK_K': 256, 'SWAP_AB': False, 'num_warps': 4, 'num_stages': 4, 'SPLIT_K': 4},
    (1, 128256, 4096): {'BLOCK_M': 16, 'BLOCK_N': 64, 'BLOCK_K': 256, 'SWAP_AB': False, 'num_warps': 4, 'num_stages': 4, 'SPLIT_K': 1},
    (2, 128256, 4096): {'BLOCK_M': 16, 'BLOCK_N': 64, 'BLOCK_K': 256, 'SWAP_AB': False, 'num_warps': 4, 'num_stages': 4, 'SPLIT_K': 1},
    (4, 128256, 4096): {'BLOCK_M': 16, 'BLOCK_N': 64, 'BLOCK_K': 256, 'SWAP_AB': False, 'num_warps': 4, 'num_stages': 4, 'SPLIT_K': 1},
    (8, 128256, 4096): {'BLOCK_M': 16, 'BLOCK_N': 64, 'BLOCK_K': 256, 'SWAP_AB': False, 'num_warps': 4, 'num_stages': 4, 'SPLIT_K': 1},
    (16, 128256, 4096): {'BLOCK_M': 16, 'BLOCK_N': 64, 'BLOCK_K': 256, 'SWAP_AB': False, 'num_warps': 4, 'num_stages': 4, 'SPLIT_K': 1},
}


@triton.jit
def tile_ids(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of this program: column tiles run fastest within groups of GROUP_M row tiles
    (Triton's matmul tutorial order); with one row tile, pid_n is program_id(0)."""
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    width = GROUP_M * tiles_n
    first_m = (pid // width) * GROUP_M
    group_rows = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % group_rows
    pid_n = (pid % width) // group_rows
    return pid_m, pid_n


@triton.jit
def _exact_float(w):
    """int8 -> float32 without a conversion instruction (a quarter-rate I2F per element): the bits
    0x4B400000 + w read as float32 are 1.5 * 2^23 + w for any |w| < 2^22."""
    return (w.to(tl.int32) + 0x4B400000).to(tl.float32, bitcast=True) - 12582912.0


@triton.jit(do_not_specialize=["M"])  # every row count shares one compile per tile shape
def _int8_matmul_kernel(x_ptr, w_ptr, scale_ptr, bias_ptr, out_ptr, partial_ptr, count_ptr,
                        M, N, K, K_SPLIT, stride_xm, stride_wn, stride_om,
                        HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, GROUP_M: tl.constexpr, SWAP_AB: tl.constexpr,
                        EVEN_N: tl.constexpr, EVEN_K: tl.constexpr, PRECISION: tl.constexpr):
    pid_m, pid_n = tile_ids(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    pid_k = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    n_mask = offs_n < N
    k_lo = pid_k * K_SPLIT
    k_hi = tl.minimum(k_lo + K_SPLIT, K)
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + (k_lo + offs_k)[None, :]  # [BLOCK_M, BLOCK_K]
    w_ptrs = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn + (k_lo + offs_k)[None, :]  # [BLOCK_N, BLOCK_K]
    if BLOCK_M == 1:
        acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    elif SWAP_AB:
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        if EVEN_K:
            x = tl.load(x_ptrs, mask=m_mask[:, None], other=0.0)
            if EVEN_N:
                w = tl.load(w_ptrs)
            else:
                w = tl.load(w_ptrs, mask=n_mask[:, None], other=0)
        else:
            k_mask = (k0 + offs_k) < k_hi
            x = tl.load(x_ptrs, mask=m_mask[:, None] & k_mask[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=n_mask[:, None] & k_mask[None, :], other=0)
        if BLOCK_M == 1:
            acc += _exact_float(w) * x.to(tl.float32)  # [BLOCK_N, BLOCK_K] * [1, BLOCK_K]
        elif SWAP_AB:  # [BLOCK_N, BLOCK_M]: the weight tile feeds the MMA's M side (wgmma from BLOCK_N = 64)
            acc = tl.dot(w.to(x.dtype), tl.trans(x), acc, input_precision=PRECISION)  # int8 is exact in x's dtype
        else:
            acc = tl.dot(x, tl.trans(w.to(x.dtype)), acc, input_precision=PRECISION)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if BLOCK_M == 1:
        acc = tl.sum(acc, 1)[None, :]  # [1, BLOCK_N]
    elif SWAP_AB:
        acc = tl.trans(acc)
    out = acc * tl.load(scale_ptr + offs_n, mask=n_mask, other=0.0)[None, :]
    finish_tile(out, bias_ptr, out_ptr, partial_ptr, count_ptr, pid_n, pid_k, offs_m, offs_n, m_mask, n_mask, N,
                stride_om, HAS_BIAS, BLOCK_M, BLOCK_N, SPLIT_K)


def m_bucket(m: int) -> int:
    """The config-table row of m rows: the smallest M_BUCKETS entry >= m (the last for more)."""
    return next((b for b in M_BUCKETS if b >= m), M_BUCKETS[-1])


@functools.lru_cache(maxsize=None)
def sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 8


def decode_split_k(n: int, k: int, block_n: int, block_k: int, device: torch.device) -> int:
    """K splits for a one-row-tile grid: two programs per SM where the column tiles are fewer (at most 8
    splits), but at least four K steps per split."""
    split = min(8, triton.cdiv(2 * sm_count(device), triton.cdiv(n, block_n)))
    return max(1, min(split, k // (4 * block_k)))


def default_config(m: int, n: int, k: int, device: torch.device) -> dict:
    """Measured configs first (CONFIGS), else (unmeasured guesses): one row in [16, 512] multiply-add tiles
    (512 bytes of weight per row and step, the bf16 skinny_matmul's best); 2..16 rows in one 16-row dot
    tile of [64, 256]; both with decode_split_k's K splits; more rows in 128 x 128 GEMM tiles."""
    if (m_bucket(m), n, k) in CONFIGS:
        return CONFIGS[(m_bucket(m), n, k)]
    if m <= MAX_ROWS:
        block_m, block_n, block_k = (1, 16, 512) if m == 1 else (16, 64, 256)
        return {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k, "num_warps": 4, "num_stages": 4,
                "SPLIT_K": decode_split_k(n, k, block_n, block_k, device)}
    return {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3}


class LaunchPlan(NamedTuple):
    """How one call runs: tiles, K splits, grid, and the split-K workspace (partial, counters)."""
    block_m: int
    block_k: int
    split_k: int
    k_split: int  # columns of K per split, a multiple of block_k
    grid: tuple[int, int]
    partial: torch.Tensor | None  # [split_k, block_m, N] float32 when split_k > 1
    counters: torch.Tensor | None


def tile_shape(m: int, k: int, config: dict, dot_min_block_k: int = 16) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_K) a launch uses: BLOCK_M by default 1 for one row, MAX_ROWS up to MAX_ROWS rows, else
    64; BLOCK_K cut to K's power of two but at least 16, and for dot tiles (BLOCK_M > 1) dot_min_block_k."""
    block_m = config.get("BLOCK_M", 1 if m == 1 else MAX_ROWS if m <= MAX_ROWS else 64)
    least = 16 if block_m == 1 else dot_min_block_k
    return block_m, min(max(config["BLOCK_K"], least), max(least, triton.next_power_of_2(k)))


def plan_launch(m: int, n: int, k: int, config: dict, device: torch.device, dot_min_block_k: int = 16) -> LaunchPlan:
    """The launch of config for an [m, k] x [n, k]^T product (tile_shape's tiles). SPLIT_K > 1 is honoured
    only where one M tile holds every row, and never leaves an empty split."""
    block_m, block_k = tile_shape(m, k, config, dot_min_block_k)
    tiles_m, tiles_n = triton.cdiv(m, block_m), triton.cdiv(n, config["BLOCK_N"])
    split_k = config.get("SPLIT_K", 1) if tiles_m == 1 else 1
    k_split = triton.cdiv(triton.cdiv(k, split_k), block_k) * block_k
    split_k = triton.cdiv(k, k_split)  # no empty splits
    partial = counters = None
    if split_k > 1:
        assert tiles_n <= MAX_COLUMN_TILES
        partial = torch.empty((split_k, block_m, n), dtype=torch.float32, device=device)
        counters = split_k_counters(device)
    return LaunchPlan(block_m, block_k, split_k, k_split, (tiles_m * tiles_n, split_k), partial, counters)


def dot_precision(dtype: torch.dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"  # tf32 only matters for float32 operands


def int8_matmul(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None = None,
                config: dict | None = None) -> torch.Tensor:
    """x @ (weight * weight_scale[:, None])^T + bias for x: [M, K] (last-dim stride 1), weight: int8 [N, K]
    contiguous, weight_scale: float32 [N], bias: [N] or None -> a new contiguous [M, N] in x's dtype.
    config: default_config's keys (BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, GROUP_M, num_warps, num_stages)."""
    m, k = x.shape
    n = weight.shape[0]
    assert weight.dtype == torch.int8 and weight.shape == (n, k) and weight.is_contiguous() and x.stride(-1) == 1
    assert weight_scale.shape == (n,) and weight_scale.dtype == torch.float32
    out = x.new_empty((m, n))
    if m == 0:
        return out
    config = config or default_config(m, n, k, x.device)
    plan = plan_launch(m, n, k, config, x.device)
    _int8_matmul_kernel[plan.grid](
        x, weight, weight_scale, weight_scale if bias is None else bias, out,
        out if plan.partial is None else plan.partial, out if plan.counters is None else plan.counters,
        m, n, k, plan.k_split, x.stride(0), weight.stride(0), out.stride(0),
        HAS_BIAS=bias is not None, BLOCK_M=plan.block_m, BLOCK_N=config["BLOCK_N"], BLOCK_K=plan.block_k,
        SPLIT_K=plan.split_k, GROUP_M=config.get("GROUP_M", 8), SWAP_AB=config.get("SWAP_AB", False),
        EVEN_N=n % config["BLOCK_N"] == 0,
        EVEN_K=plan.k_split * plan.split_k == k, PRECISION=dot_precision(x.dtype),
        num_warps=config["num_warps"], num_stages=config["num_stages"])
    return out
