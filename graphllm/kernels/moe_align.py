"""moe_align_block_size: the (token, choice) pairs of a step grouped by expert, each group padded to a
multiple of BLOCK_M, so that every BLOCK_M rows of the grouped GEMM (graphllm/kernels/moe_experts.py,
its "sorted" row source) belong to one expert. vLLM's layout:

    topk_ids [T, k]        -> pair p = t * k + j chose expert topk_ids[t, j]
    sorted_ids [EM] int32  pairs of expert 0 in pair order, padded with T*k (past every pair: masked),
                           then expert 1's, ...; rows past num_padded hold T*k too
    expert_ids [EM / BLOCK_M] int32   the expert of each block of BLOCK_M rows (E - 1 past num_padded)
    num_padded [1] int32   the rows in use (sum of the padded group sizes); later blocks are idle

Every tensor is sized from shapes alone: EM = T*k + min(T*k, E) * (BLOCK_M - 1), the worst case (at most
min(T*k, E) experts are used, each wasting at most BLOCK_M - 1 rows), rounded up to BLOCK_M. Nothing is
read on the host, so it runs inside a CUDA graph.

moe_align_block_size is one Triton program (one launch): it counts the pairs per expert, prefix-sums the
padded counts, fills sorted_ids with padding, then places each pair at its group's start plus its rank
among the earlier pairs of its expert, and writes expert_ids. It walks the pairs in chunks of [CHUNK, E]
one-hot tiles (CHUNK = 16384 / E), O(T*k*E / lanes) work on one SM: meant for the prefill sizes that take
the sorted path (fused_moe.py; decode steps skip the alignment). moe_align_block_size_reference is the
same layout in plain torch (about 26 launches), the oracle of tests/kernels/test_moe_align.py; it also
runs on meta tensors.
"""

import torch
import triton
import triton.language as tl

from graphllm.kernels.gdc import dependent_start
from graphllm.kernels.launch import pdl_launch


def max_padded_rows(num_pairs: int, num_experts: int, block_m: int) -> int:
    """EM: the rows sorted_ids needs at worst for num_pairs pairs over num_experts experts."""
    worst = num_pairs + min(num_pairs, num_experts) * (block_m - 1)
    return -(-worst // block_m) * block_m


def moe_align_block_size_reference(topk_ids: torch.Tensor, num_experts: int,
                                   block_m: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """topk_ids [T, k] (int) -> (sorted_ids [EM] int32, expert_ids [EM / block_m] int32, num_padded [1] int32)."""
    flat = topk_ids.reshape(-1).long()  # [P], P = T*k
    num_pairs, device = flat.numel(), flat.device
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m  # [E]
    group_ends = padded.cumsum(0)  # [E] end row of each expert's group
    experts_sorted, pairs_sorted = torch.sort(flat, stable=True)  # [P]: pairs grouped by expert, in order
    first_of_expert = counts.cumsum(0) - counts  # [E] position of each expert's first pair in the sort
    rank = torch.arange(num_pairs, device=device) - first_of_expert[experts_sorted]  # [P] rank within its expert
    rows = group_ends[experts_sorted] - padded[experts_sorted] + rank  # [P] its row in sorted_ids
    total = max_padded_rows(num_pairs, num_experts, block_m)
    sorted_ids = torch.full((total,), num_pairs, dtype=torch.int32, device=device)
    sorted_ids.scatter_(0, rows, pairs_sorted.to(torch.int32))
    block_starts = torch.arange(0, total, block_m, device=device)  # [EM / block_m]
    expert_ids = torch.searchsorted(group_ends, block_starts, right=True).clamp_(max=num_experts - 1)
    return sorted_ids, expert_ids.to(torch.int32), group_ends[-1:].to(torch.int32)


@triton.jit
def _one_hot(ids_ptr, start, num_pairs, E_POW2: tl.constexpr, CHUNK: tl.constexpr):
    """Pairs start..start+CHUNK against the experts: ([CHUNK, E_POW2] bool, pair offsets [CHUNK])."""
    pairs = start + tl.arange(0, CHUNK)
    ids = tl.load(ids_ptr + pairs, mask=pairs < num_pairs, other=-1)
    return ids[:, None] == tl.arange(0, E_POW2)[None, :], pairs


@triton.jit
def _moe_align_kernel(ids_ptr, sorted_ids_ptr, expert_ids_ptr, num_padded_ptr, num_pairs, num_experts, num_rows,
                      BLOCK_M: tl.constexpr, E_POW2: tl.constexpr, CHUNK: tl.constexpr, PDL: tl.constexpr = False):
    if PDL:  # launched as a programmatic dependent (launch.py): nothing is read before the kernels before are done
        dependent_start()
    experts = tl.arange(0, E_POW2)
    counts = tl.zeros([E_POW2], dtype=tl.int32)
    for start in range(0, num_pairs, CHUNK):
        hot, _ = _one_hot(ids_ptr, start, num_pairs, E_POW2, CHUNK)
        counts += tl.sum(hot.to(tl.int32), axis=0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M  # [E_POW2], 0 past the experts
    group_ends = tl.cumsum(padded, axis=0)
    tl.store(num_padded_ptr, tl.sum(padded, axis=0))
    for start in range(0, num_rows, CHUNK):  # padding everywhere first; the pairs overwrite their rows
        rows = start + tl.arange(0, CHUNK)
        tl.store(sorted_ids_ptr + rows, tl.zeros([CHUNK], dtype=tl.int32) + num_pairs, mask=rows < num_rows)
    for start in range(0, num_rows // BLOCK_M, CHUNK):
        blocks = start + tl.arange(0, CHUNK)
        ends_passed = tl.sum((group_ends[None, :] <= (blocks * BLOCK_M)[:, None]).to(tl.int32), axis=1)
        tl.store(expert_ids_ptr + blocks, tl.minimum(ends_passed, num_experts - 1), mask=blocks < num_rows // BLOCK_M)
    tl.debug_barrier()  # the padding is stored before any thread places a pair
    next_row = group_ends - padded  # [E_POW2] where each expert's next pair goes
    for start in range(0, num_pairs, CHUNK):
        hot, pairs = _one_hot(ids_ptr, start, num_pairs, E_POW2, CHUNK)
        hot = hot.to(tl.int32)
        before = tl.cumsum(hot, axis=0) - hot  # [CHUNK, E_POW2] earlier pairs of the chunk with that expert
        rows = tl.sum(hot * (next_row[None, :] + before), axis=1)  # [CHUNK]
        tl.store(sorted_ids_ptr + rows, pairs, mask=pairs < num_pairs)
        next_row += tl.sum(hot, axis=0)


def moe_align_block_size(topk_ids: torch.Tensor, num_experts: int,
                         block_m: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """topk_ids [T, k] int32 -> (sorted_ids [EM] int32, expert_ids [EM / block_m] int32, num_padded [1] int32),
    in one launch (the layout of the module docstring)."""
    flat = topk_ids.reshape(-1)
    assert flat.dtype == torch.int32 and flat.is_contiguous(), (flat.dtype, topk_ids.stride())
    num_pairs, device = flat.numel(), flat.device
    num_rows = max_padded_rows(num_pairs, num_experts, block_m)
    sorted_ids = torch.empty(num_rows, dtype=torch.int32, device=device)
    expert_ids = torch.empty(num_rows // block_m, dtype=torch.int32, device=device)
    num_padded = torch.empty(1, dtype=torch.int32, device=device)
    e_pow2 = triton.next_power_of_2(num_experts)
    _moe_align_kernel[(1,)](flat, sorted_ids, expert_ids, num_padded, num_pairs, num_experts, num_rows,
                            BLOCK_M=block_m, E_POW2=e_pow2, CHUNK=min(1024, max(16, 16384 // e_pow2)), num_warps=8,
                            **pdl_launch(device))
    return sorted_ids, expert_ids, num_padded
