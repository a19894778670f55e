"""Merging split-KV partial attention outputs: the decode reduce kernel's arithmetic, and the same merge done by
the last split program of each (sequence, KV head) instead of by a kernel of its own (FUSED_MERGE).

Split programs leave a normalised partial output and its log2-sum-exp2 per query head; the merge weighs them by
exp2(lse - max lse). With FUSED_MERGE each split program, once its partials are stored, makes them visible GPU-wide
(every thread fences), then counts itself in at an int32 counter of its (sequence, KV head) (one acq_rel atomic
a program); the program that counts last fences again, merges the group's heads from L2 (loads that bypass L1)
and puts the counter back to 0, so that the next launch, or the next replay of a CUDA graph, finds it zeroed.
Nothing waits on another program: the last to arrive merges. One launch a layer fewer than the reduce kernel, at
the cost of an atomic round trip at the end of every split program; under Triton's interpreter programs run one
after another, so the last in grid order merges (FENCE off: no asm there).
"""

import torch
import triton
import triton.language as tl

_COUNTERS: dict[tuple[torch.device, int], torch.Tensor] = {}


def merge_counters(device: torch.device, n: int) -> torch.Tensor:
    """n zeroed int32 counters on device, kept for every later launch (each merge leaves them at 0 again). Made
    at the first launch that needs them: inside a CUDA-graph capture the zeroing is captured with it, which is
    harmless (the counters are 0 then anyway)."""
    key = (device, n)
    if key not in _COUNTERS:
        _COUNTERS[key] = torch.zeros(n, dtype=torch.int32, device=device)
    return _COUNTERS[key]


@triton.jit
def fence_gpu(x):
    """A GPU-scope acq_rel fence in every thread (x: any int32 tensor, returned unchanged: the asm needs an
    operand, and it is not pure so that it stays where it is)."""
    return tl.inline_asm_elementwise("fence.acq_rel.gpu; mov.b32 $0, $1;", "=r,r", [x], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit
def merge_splits(part_out_ptr, part_lse_ptr, row, num_splits, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                 CACHE: tl.constexpr):
    """The merged output [BLOCK_D] (float32) of one query head whose num_splits partials start at `row` of part_out
    [rows, D] and part_lse [rows]; CACHE: the loads' cache_modifier ("" or ".cg", which bypasses L1: partials
    other programs wrote this launch). The splits are summed one after another in split order, so the sum is the
    same bits whatever the launching kernel's warps and layout (a tree sum over a [splits, D] tile is not: on the
    H200 the split kernel's 4-warp merge and the reduce kernel's 2-warp one differed from 3 splits on)."""
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    m = tl.load(part_lse_ptr + row, cache_modifier=CACHE)
    for s in range(1, num_splits):
        m = tl.maximum(m, tl.load(part_lse_ptr + row + s, cache_modifier=CACHE))
    m = tl.where(m > float("-inf"), m, 0.0)  # every split empty: lse -inf everywhere, zeros out
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    total = tl.sum(acc, 0)
    for s in range(num_splits):
        lse = tl.load(part_lse_ptr + row + s, cache_modifier=CACHE)
        w = tl.where(lse > float("-inf"), tl.exp2(lse - m), 0.0)
        part = tl.load(part_out_ptr + (row + s) * HEAD_DIM + offs_d, mask=d_mask, other=0.0, cache_modifier=CACHE)
        acc += part * w
        total += w
    return acc / tl.where(total > 0, total, 1.0)


@triton.jit
def merge_if_last(part_out_ptr, part_lse_ptr, counter_ptr, out_ptr, q_row, first_row, num_splits, stride_ob,
                  stride_oh, first_head, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
                  BLOCK_D: tl.constexpr, FENCE: tl.constexpr):
    """Count this split program in at counter_ptr; the last of its num_splits merges the GROUP query heads from
    first_head (whose partials start at first_row, num_splits rows a head) into out's row q_row, and zeroes the
    counter."""
    if FENCE:  # every thread's partial stores visible GPU-wide before the count says they are there
        fence_gpu(tl.zeros([1], dtype=tl.int32))
    tl.debug_barrier()  # every thread has fenced before the one thread that counts does
    arrived = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu")
    if arrived == num_splits - 1:
        if FENCE:
            fence_gpu(tl.zeros([1], dtype=tl.int32))
        offs_d = tl.arange(0, BLOCK_D)
        for g in tl.static_range(GROUP):
            out = merge_splits(part_out_ptr, part_lse_ptr, first_row + g * num_splits, num_splits, HEAD_DIM, BLOCK_D,
                               ".cg")
            tl.store(out_ptr + q_row * stride_ob + (first_head + g) * stride_oh + offs_d,
                     out.to(out_ptr.dtype.element_ty), mask=offs_d < HEAD_DIM)
        tl.atomic_xchg(counter_ptr, 0, sem="relaxed", scope="gpu")
