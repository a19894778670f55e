"""moe_align_block_size: the (token, choice) pairs of a step grouped by expert, each group padded to a
multiple of BLOCK_M, so that every BLOCK_M rows of the grouped GEMM (graphllm/kernels/fused_moe.py) belong
to one expert. vLLM's layout:

    topk_ids [T, k]        -> pair p = t * k + j chose expert topk_ids[t, j]
    sorted_ids [EM] int32  pairs of expert 0, padded with T*k (past every pair: masked), then expert 1's, ...
    expert_ids [EM / BLOCK_M] int32   the expert of each block of BLOCK_M rows
    num_padded [1] int32   the rows in use (sum of the padded group sizes); later blocks are idle

Every tensor is sized from shapes alone: EM = T*k + min(T*k, E) * (BLOCK_M - 1), the worst case (at most
min(T*k, E) experts are used, each wasting at most BLOCK_M - 1 rows), rounded up to BLOCK_M. The grouping
is a stable sort plus scatters, all on the device: no host read (.item(), nonzero, bincount), so it runs
inside a CUDA graph, and on meta tensors (tests/kernels/test_fused_moe.py checks that). Plain torch.
"""

import torch


def max_padded_rows(num_pairs: int, num_experts: int, block_m: int) -> int:
    """EM: the rows sorted_ids needs at worst for num_pairs pairs over num_experts experts."""
    worst = num_pairs + min(num_pairs, num_experts) * (block_m - 1)
    return -(-worst // block_m) * block_m


def moe_align_block_size(topk_ids: torch.Tensor, num_experts: int,
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
