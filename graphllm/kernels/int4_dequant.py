"""The int4 layout (graphllm/kernels/quant_layout.py) -> a dense W^T [K, N] in the activation dtype: one
Triton kernel, for linears whose row count is past the small-M kernels' (prefill chunks, large decode
batches), which then run cuBLAS on the dense weight.

    qweight int32 [K/8, N], scales / zeros [K/G, N]  ->  w [K, N],  w[k, n] = (q[k, n] - zeros[k//G, n]) * scales[k//G, n]

Grid (K/8 / BLOCK_R, N / BLOCK_N): a program loads words [BLOCK_R, BLOCK_N] (coalesced along N) and writes
the 8 rows each word holds. (q - z) * s is exact in float32 and rounded once to the output dtype. Cost:
0.5 byte read and 2 bytes written per weight element, then cuBLAS reads the 2 bytes again, so for rows
where the matmul is weight-bound this path moves ~4.5x the int4 bytes; it pays off only past the rows
where int4_matmul's small-M tiles stop being flat (measured in benchmarks/quant_kernel_sweep.py).
"""

import torch
import triton
import triton.language as tl

from graphllm.kernels.quant_layout import INT4_PACK

BLOCK_R, BLOCK_N = 16, 128  # words per program: [16, 128] -> [128, 128] outputs


@triton.jit
def _int4_dequant_kernel(qw_ptr, scales_ptr, zeros_ptr, out_ptr, R, N, G,
                         BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr):
    offs_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)  # word rows
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_r < R)[:, None] & (offs_n < N)[None, :]
    words = tl.load(qw_ptr + offs_r[:, None] * N + offs_n[None, :], mask=mask, other=0)
    group = (offs_r * 8) // G  # the 8 rows of a word share a group (G is a multiple of 8)
    s = tl.load(scales_ptr + group[:, None] * N + offs_n[None, :], mask=mask, other=0.0).to(tl.float32)
    z = tl.load(zeros_ptr + group[:, None] * N + offs_n[None, :], mask=mask, other=0.0).to(tl.float32)
    for j in tl.static_range(8):
        q = ((words >> (4 * j)) & 0xF).to(tl.float32)
        w = (q - z) * s
        tl.store(out_ptr + (offs_r * 8 + j)[:, None] * N + offs_n[None, :], w.to(out_ptr.dtype.element_ty), mask=mask)


def int4_dequantize(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A new dense W^T [K, N] in `dtype` from the int4 layout (contiguous tensors)."""
    rows, n = qweight.shape
    k = rows * INT4_PACK
    out = torch.empty((k, n), dtype=dtype, device=qweight.device)
    grid = (triton.cdiv(rows, BLOCK_R), triton.cdiv(n, BLOCK_N))
    _int4_dequant_kernel[grid](qweight, scales, zeros, out, rows, n, k // scales.shape[0],
                               BLOCK_R=BLOCK_R, BLOCK_N=BLOCK_N)
    return out


def int4_dequant_matmul(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                        bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ W^T (+ bias) through a dense dequantized weight and cuBLAS -> [M, N] in x's dtype."""
    w = int4_dequantize(qweight, scales, zeros, x.dtype)  # [K, N]
    out = x @ w
    return out if bias is None else out + bias
