"""Merging split-KV partial attention outputs: the decode reduce kernel's arithmetic.

Split programs leave a normalised partial output and its log2-sum-exp2 per query head; the merge weighs them by
exp2(lse - max lse). The splits are summed one after another in split order, so the bits do not depend on the
layout (warps, tiles) of the kernel that runs the merge.
"""

import triton
import triton.language as tl


@triton.jit
def merge_splits(part_out_ptr, part_lse_ptr, row, num_splits, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """The merged output [BLOCK_D] (float32) of one query head whose num_splits partials start at `row` of part_out
    [rows, D] and part_lse [rows]. The splits are summed one after another in split order, so the sum is the
    same bits whatever the launching kernel's warps and layout (a tree sum over a [splits, D] tile is not: on the
    H200 a 4-warp merge and the reduce kernel's 2-warp one differed from 3 splits on)."""
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    m = tl.load(part_lse_ptr + row)
    for s in range(1, num_splits):
        m = tl.maximum(m, tl.load(part_lse_ptr + row + s))
    m = tl.where(m > float("-inf"), m, 0.0)  # every split empty: lse -inf everywhere, zeros out
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    total = tl.sum(acc, 0)
    for s in range(num_splits):
        lse = tl.load(part_lse_ptr + row + s)
        w = tl.where(lse > float("-inf"), tl.exp2(lse - m), 0.0)
        part = tl.load(part_out_ptr + (row + s) * HEAD_DIM + offs_d, mask=d_mask, other=0.0)
        acc += part * w
        total += w
    return acc / tl.where(total > 0, total, 1.0)
