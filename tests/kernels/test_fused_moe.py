"""The Triton fused MoE (grouped GEMMs over pairs sorted by expert) equals the PyTorch reference, and
moe_align_block_size lays the pairs out as the kernel needs, from shapes alone (it runs on meta tensors)."""

import pytest
import torch

pytest.importorskip("triton")

from graphllm.kernels.fused_moe import fused_experts, fused_experts_reference, tiles_for  # noqa: E402
from graphllm.kernels.fused_moe_reference import select_experts  # noqa: E402
from graphllm.kernels.moe_align import max_padded_rows, moe_align_block_size  # noqa: E402
from tests.kernels.conftest import DEVICE, assert_close, gpu_only, randn  # noqa: E402

HIDDEN, SIZE = 32, 48  # H, I: I is not a multiple of the K tile (masked tail)
ROUTES = [(4, 1, False), (8, 2, True), (8, 2, False), (6, 3, True)]  # (experts, top_k, renormalize)


def moe_inputs(num_tokens: int, num_experts: int, top_k: int, renormalize: bool, dtype: torch.dtype, seed: int = 0):
    x = randn((num_tokens, HIDDEN), dtype, seed)
    w13 = randn((num_experts, 2 * SIZE, HIDDEN), dtype, seed + 1) * 0.2
    w2 = randn((num_experts, HIDDEN, SIZE), dtype, seed + 2) * 0.2
    weights, ids = select_experts(randn((num_tokens, num_experts), torch.float32, seed + 3), top_k, renormalize)
    return x, weights, ids, w13, w2


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16, torch.float16))
@pytest.mark.parametrize("num_experts, top_k, renormalize", ROUTES)
@pytest.mark.parametrize("num_tokens", (1, 3, 17, 64))  # 1, 3: decode tiles (T <= E); 17, 64: prefill tiles
def test_matches_reference(num_tokens, num_experts, top_k, renormalize, dtype):
    x, weights, ids, w13, w2 = moe_inputs(num_tokens, num_experts, top_k, renormalize, dtype)
    got = fused_experts(x, weights, ids, w13, w2)
    assert got.is_contiguous()
    assert_close(got, fused_experts_reference(x, weights, ids, w13, w2))


def test_unchosen_experts_and_padding_rows_are_never_read():
    x, weights, ids, w13, w2 = moe_inputs(5, 8, 2, True, torch.float32)
    unused = sorted(set(range(8)) - set(ids.flatten().tolist()))
    assert unused, "the seed should leave an expert unchosen"
    w13[unused], w2[unused] = float("nan"), float("nan")
    got = fused_experts(x, weights, ids, w13, w2)
    assert torch.isfinite(got).all()
    assert_close(got, fused_experts_reference(x, weights, ids, w13, w2))


def test_no_tokens():
    x, weights, ids, w13, w2 = moe_inputs(0, 4, 2, True, torch.float32)
    assert fused_experts(x, weights, ids, w13, w2).shape == (0, HIDDEN)


@pytest.mark.parametrize("num_tokens, num_experts, top_k, block_m", [(1, 8, 2, 16), (17, 8, 2, 64), (9, 4, 3, 4),
                                                                      (40, 128, 8, 16)])
def test_alignment_groups_every_pair_once_by_expert(num_tokens, num_experts, top_k, block_m):
    gen = torch.Generator().manual_seed(num_tokens)
    ids = torch.stack([torch.randperm(num_experts, generator=gen)[:top_k] for _ in range(num_tokens)])  # [T, k]
    sorted_ids, expert_ids, num_padded = moe_align_block_size(ids.to(DEVICE), num_experts, block_m)
    sorted_ids, expert_ids, used = sorted_ids.cpu(), expert_ids.cpu(), int(num_padded.item())
    num_pairs = num_tokens * top_k
    assert sorted_ids.numel() == max_padded_rows(num_pairs, num_experts, block_m) >= used
    assert used % block_m == 0 and expert_ids.numel() == sorted_ids.numel() // block_m
    real = sorted_ids[sorted_ids < num_pairs]
    assert sorted(real.tolist()) == list(range(num_pairs))  # every pair exactly once
    assert (sorted_ids[used:] == num_pairs).all()  # idle rows are padding
    flat = ids.flatten()
    for block in range(used // block_m):
        rows = sorted_ids[block * block_m:(block + 1) * block_m]
        rows = rows[rows < num_pairs]
        assert len(rows) and (flat[rows.long()] == expert_ids[block]).all()  # one expert per block
        assert rows.tolist() == sorted(rows.tolist())  # stable: token order within an expert
    counts = torch.bincount(flat, minlength=num_experts)
    assert used == int(((counts + block_m - 1) // block_m * block_m).sum())


def test_alignment_needs_no_values_only_shapes():
    """On meta tensors no op can read a value: the layout needs no host read, so it fits in a CUDA graph."""
    ids = torch.empty((64, 8), dtype=torch.int64, device="meta")
    sorted_ids, expert_ids, num_padded = moe_align_block_size(ids, 128, 16)
    assert sorted_ids.shape == (max_padded_rows(512, 128, 16),) and num_padded.shape == (1,)
    assert expert_ids.shape == (sorted_ids.numel() // 16,)


def test_tiles_follow_tokens_per_expert():
    assert tiles_for(4, 8)["BLOCK_M"] == 16 and tiles_for(64, 8)["BLOCK_M"] == 64


@gpu_only
def test_replays_in_a_cuda_graph_with_new_routing():
    """Captured once, replayed with other tokens and other experts chosen: no host read, buffers from shapes."""
    x, weights, ids, w13, w2 = moe_inputs(8, 8, 2, True, torch.bfloat16)
    static = [x.clone(), weights.clone(), ids.clone()]
    fused_experts(*static, w13, w2)  # compiles the kernels outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_experts(*static, w13, w2)
    for seed in (1, 2):
        fresh = moe_inputs(8, 8, 2, True, torch.bfloat16, seed=10 * seed)[:3]
        for buffer, value in zip(static, fresh):
            buffer.copy_(value)
        graph.replay()
        assert_close(out, fused_experts_reference(*fresh, w13, w2))
