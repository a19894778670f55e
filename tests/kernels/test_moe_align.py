"""moe_align_block_size (one Triton program) lays the pairs out exactly as the torch reference does: grouped
by expert in pair order, each group padded to BLOCK_M, with static worst-case sizes."""

import pytest
import torch

pytest.importorskip("triton")

from graphllm.kernels.moe_align import (max_padded_rows, moe_align_block_size,  # noqa: E402
                                        moe_align_block_size_reference)
from tests.kernels.conftest import DEVICE  # noqa: E402

CASES = [(1, 8, 2, 16), (17, 8, 2, 64), (9, 4, 3, 4), (40, 128, 8, 16), (600, 8, 2, 16), (64, 128, 8, 32),
         (3, 6, 3, 16)]  # (tokens, experts, top_k, block_m): 40 x 8 and 600 x 2 pairs cross the kernel's chunks


def routing(num_tokens: int, num_experts: int, top_k: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(num_tokens)
    ids = torch.stack([torch.randperm(num_experts, generator=gen)[:top_k] for _ in range(num_tokens)])  # [T, k]
    return ids.to(device=DEVICE, dtype=torch.int32)


@pytest.mark.parametrize("num_tokens, num_experts, top_k, block_m", CASES)
def test_equals_the_reference(num_tokens, num_experts, top_k, block_m):
    ids = routing(num_tokens, num_experts, top_k)
    for got, expected in zip(moe_align_block_size(ids, num_experts, block_m),
                             moe_align_block_size_reference(ids, num_experts, block_m)):
        assert got.dtype == expected.dtype == torch.int32
        assert torch.equal(got.cpu(), expected.cpu())


@pytest.mark.parametrize("align", (moe_align_block_size, moe_align_block_size_reference))
@pytest.mark.parametrize("num_tokens, num_experts, top_k, block_m", CASES[:4])
def test_groups_every_pair_once_by_expert(num_tokens, num_experts, top_k, block_m, align):
    ids = routing(num_tokens, num_experts, top_k)
    sorted_ids, expert_ids, num_padded = align(ids, num_experts, block_m)
    sorted_ids, expert_ids, used = sorted_ids.cpu(), expert_ids.cpu(), int(num_padded.item())
    num_pairs = num_tokens * top_k
    assert sorted_ids.numel() == max_padded_rows(num_pairs, num_experts, block_m) >= used
    assert used % block_m == 0 and expert_ids.numel() == sorted_ids.numel() // block_m
    real = sorted_ids[sorted_ids < num_pairs]
    assert sorted(real.tolist()) == list(range(num_pairs))  # every pair exactly once
    assert (sorted_ids[used:] == num_pairs).all()  # idle rows are padding
    flat = ids.flatten().cpu()
    for block in range(used // block_m):
        rows = sorted_ids[block * block_m:(block + 1) * block_m]
        rows = rows[rows < num_pairs]
        assert len(rows) and (flat[rows.long()] == expert_ids[block]).all()  # one expert per block
        assert rows.tolist() == sorted(rows.tolist())  # stable: token order within an expert
    counts = torch.bincount(flat.long(), minlength=num_experts)
    assert used == int(((counts + block_m - 1) // block_m * block_m).sum())


def test_reference_needs_no_values_only_shapes():
    """On meta tensors no op can read a value: the layout needs no host read, so it fits in a CUDA graph."""
    ids = torch.empty((64, 8), dtype=torch.int64, device="meta")
    sorted_ids, expert_ids, num_padded = moe_align_block_size_reference(ids, 128, 16)
    assert sorted_ids.shape == (max_padded_rows(512, 128, 16),) and num_padded.shape == (1,)
    assert expert_ids.shape == (sorted_ids.numel() // 16,)
