"""Fused mixture-of-experts in Triton, vLLM's design: one grouped GEMM per projection over the step's
(token, choice) pairs grouped by expert.

    moe_align_block_size(topk_ids)            pairs sorted by expert, each group padded to BLOCK_M rows
                                              (graphllm/kernels/moe_align.py: on the device, no host read)
    cache1 = grouped_gemm(x, w13)             [T*k, 2I]  row p: x[p // k] @ w13[e]^T, e = the pair's expert
    cache2 = silu_and_mul(cache1)             [T*k, I]   (graphllm/kernels/silu_and_mul.py)
    cache3 = grouped_gemm(cache2, w2) * w     [T*k, H]   the pair's routing weight multiplied in
    out    = cache3.view(T, k, H).sum(1)      [T, H]     in float32, cast once to x's dtype

Program (block, n) of the grouped GEMM takes BLOCK_M rows of sorted_ids, all of one expert (it reads the
block's expert id), and BLOCK_N output columns; padding rows (id T*k) load zeros and store nothing, and a
block past num_padded returns at once. The grid and every buffer are sized from shapes alone, so the whole
op runs inside a CUDA graph. Accumulation is float32; float32 operands use IEEE dots (no TF32), so a
float32 model keeps transformers' numbers on GPU too. The oracle is fused_moe_reference.py (tests/kernels).

On CPU tensors (only the Triton interpreter runs those, for tests) the dots are done in float32: NumPy has
no bfloat16 matmul.
"""

import torch
import triton
import triton.language as tl

from graphllm.kernels import silu_and_mul as silu_kernel  # module: the interpreter tests reload it
from graphllm.kernels.fused_moe_reference import reference_fused_experts
from graphllm.kernels.moe_align import moe_align_block_size

# vLLM's default tiles (fused_moe.get_default_config): small blocks while tokens <= experts (decode), else larger
SMALL_TILES = dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=64, GROUP_M=1)
LARGE_TILES = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GROUP_M=8)


def fused_experts_reference(x, topk_weights, topk_ids, w13, w2) -> torch.Tensor:
    """The PyTorch oracle (fused_moe_reference.reference_fused_experts)."""
    return reference_fused_experts(x, topk_weights, topk_ids, w13, w2)


def tiles_for(num_tokens: int, num_experts: int) -> dict:
    return dict(SMALL_TILES if num_tokens <= num_experts else LARGE_TILES)


@triton.jit
def _grouped_gemm_kernel(a_ptr, b_ptr, c_ptr, weights_ptr, sorted_ids_ptr, expert_ids_ptr, num_padded_ptr,
                         num_rows, N, K, num_pairs, stride_am, stride_be, stride_bn, stride_bk, stride_cm,
                         PAIRS_PER_A_ROW: tl.constexpr, MUL_WEIGHT: tl.constexpr, DOT_FP32: tl.constexpr,
                         PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    # c[pair] = a[pair // PAIRS_PER_A_ROW] @ b[expert]^T (* weights[pair]) for the block's BLOCK_M pairs
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(num_rows, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    in_group = GROUP_M * num_pid_n  # GROUP_M row blocks walk the columns together (L2 reuse of b)
    first_m = (pid // in_group) * GROUP_M
    group_m = min(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % in_group) % group_m
    pid_n = (pid % in_group) // group_m
    if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
        return
    pair = tl.load(sorted_ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))  # [BLOCK_M]
    valid = pair < num_pairs
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_rows = (pair // PAIRS_PER_A_ROW).to(tl.int64)
    a_ptrs = a_ptr + a_rows[:, None] * stride_am + offs_k[None, :]  # [BLOCK_M, BLOCK_K]
    b_ptrs = b_ptr + expert * stride_be + offs_n[None, :] * stride_bn + offs_k[:, None] * stride_bk  # [BK, BN]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=valid[:, None] & (offs_k[None, :] < k_left), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_left) & (offs_n[None, :] < N), other=0.0)
        if DOT_FP32:
            acc += tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
        else:
            acc += tl.dot(a, b, input_precision=PRECISION)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K * stride_bk
    if MUL_WEIGHT:
        acc = acc * tl.load(weights_ptr + pair, mask=valid, other=0.0)[:, None]
    c_ptrs = c_ptr + pair.to(tl.int64)[:, None] * stride_cm + offs_n[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=valid[:, None] & (offs_n[None, :] < N))


def grouped_gemm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, alignment: tuple, pairs_per_a_row: int,
                 tiles: dict, weights: torch.Tensor | None = None) -> None:
    """out[p] = a[p // pairs_per_a_row] @ b[e_p]^T (* weights[p]) for every pair p of the alignment.

    a [A, K] and out [P, N] with unit last-dim stride, b [E, N, K] any strides, weights [P] float32."""
    sorted_ids, expert_ids, num_padded = alignment
    num_pairs, n = out.shape
    k = a.shape[1]
    assert a.stride(1) == 1 and out.stride(1) == 1 and b.shape[1:] == (n, k), (a.shape, b.shape, out.shape)
    grid = (triton.cdiv(sorted_ids.numel(), tiles["BLOCK_M"]) * triton.cdiv(n, tiles["BLOCK_N"]),)
    _grouped_gemm_kernel[grid](
        a, b, out, weights if weights is not None else out, sorted_ids, expert_ids, num_padded,
        sorted_ids.numel(), n, k, num_pairs, a.stride(0), b.stride(0), b.stride(1), b.stride(2), out.stride(0),
        PAIRS_PER_A_ROW=pairs_per_a_row, MUL_WEIGHT=weights is not None, DOT_FP32=not a.is_cuda,
        PRECISION="ieee" if a.dtype == torch.float32 else "tf32", num_warps=4, **tiles)


def fused_experts(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, w13: torch.Tensor,
                  w2: torch.Tensor) -> torch.Tensor:
    """x [T, H], topk_weights [T, k] float32, topk_ids [T, k], w13 [E, 2I, H], w2 [E, H, I] -> [T, H] in x's
    dtype (the reference's function: fused_experts_reference)."""
    num_tokens, top_k = topk_ids.shape
    num_experts, size = w13.shape[0], w2.shape[2]
    if num_tokens == 0:
        return x.new_zeros(x.shape)
    x = x if x.stride(1) == 1 else x.contiguous()
    tiles = tiles_for(num_tokens, num_experts)
    alignment = moe_align_block_size(topk_ids, num_experts, tiles["BLOCK_M"])
    num_pairs = num_tokens * top_k
    cache1 = x.new_empty((num_pairs, 2 * size))  # [T*k, 2I]
    grouped_gemm(x, w13, cache1, alignment, top_k, tiles)
    cache2 = silu_kernel.silu_and_mul(cache1)  # [T*k, I]
    cache3 = x.new_empty((num_pairs, x.shape[1]))  # [T*k, H]
    grouped_gemm(cache2, w2, cache3, alignment, 1, tiles, topk_weights.reshape(-1).float().contiguous())
    return cache3.view(num_tokens, top_k, -1).sum(dim=1, dtype=torch.float32).to(x.dtype)
