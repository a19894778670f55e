"""The Triton fused MoE equals the PyTorch reference on both row sources (scan: decode, sorted: prefill), at
Qwen3-MoE's (E 128, k 8) and Mixtral's (E 8, k 2) routing shapes, and takes three launches at decode.
Routing (moe_routing.py) and the alignment (moe_align.py) have tests of their own:
tests/kernels/test_moe_routing.py, tests/kernels/test_moe_align.py."""

import pytest
import torch

pytest.importorskip("triton")

from graphllm.kernels import fused_moe as fm  # noqa: E402
from graphllm.kernels.fused_moe import fused_experts, fused_experts_reference, plan  # noqa: E402
from graphllm.kernels.fused_moe_reference import select_experts  # noqa: E402
from graphllm.kernels.skinny_matmul import split_k_counters  # noqa: E402
from tests.kernels.conftest import ON_GPU, assert_close, gpu_only, randn  # noqa: E402

HIDDEN, SIZE = 32, 48  # H, I: I is not a multiple of the 32-column tiles (masked tail)
QWEN, MIXTRAL = (128, 8, True), (8, 2, True)  # (experts, top_k, renormalize)
TOKENS = (1, 3, 8, 17, 64)
SMALL_TILES = dict(gate_up=(16, 16), down=(16, 16))  # several column tiles and K steps at HIDDEN, SIZE
PATHS = {"plan": {}, "sorted": dict(SORTED=True, BLOCK_M=16, **SMALL_TILES),
         "scan": dict(SORTED=False, BLOCK_M=16, **SMALL_TILES)}


def assert_matches(got: torch.Tensor, expected: torch.Tensor) -> None:
    """assert_close, except bfloat16 under the interpreter: it truncates float32 -> bfloat16 where the GPU
    rounds to nearest, and the op rounds five times on the way (up to 3% apart at these sizes)."""
    if got.dtype == torch.bfloat16 and not ON_GPU:
        torch.testing.assert_close(got.float(), expected.float(), atol=6e-2, rtol=6e-2)
    else:
        assert_close(got, expected)


def moe_inputs(num_tokens: int, num_experts: int, top_k: int, renormalize: bool, dtype: torch.dtype, seed: int = 0,
               hidden: int = HIDDEN, size: int = SIZE):
    x = randn((num_tokens, hidden), dtype, seed)
    w13 = randn((num_experts, 2 * size, hidden), dtype, seed + 1) * 0.2
    w2 = randn((num_experts, hidden, size), dtype, seed + 2) * 0.2
    weights, ids = select_experts(randn((num_tokens, num_experts), torch.float32, seed + 3), top_k, renormalize)
    return x, weights, ids, w13, w2


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("num_experts, top_k, renormalize", [QWEN, MIXTRAL, (6, 3, False)])
@pytest.mark.parametrize("num_tokens", TOKENS)
def test_matches_reference(num_tokens, num_experts, top_k, renormalize, path):
    x, weights, ids, w13, w2 = moe_inputs(num_tokens, num_experts, top_k, renormalize, torch.float32)
    got = fused_experts(x, weights, ids, w13, w2, PATHS[path])
    assert got.is_contiguous()
    assert_matches(got, fused_experts_reference(x, weights, ids, w13, w2))


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16))
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("num_tokens, route", [(1, QWEN), (8, QWEN), (3, MIXTRAL), (17, MIXTRAL)])
def test_half_precision_rounds_like_the_reference(num_tokens, route, path, dtype):
    x, weights, ids, w13, w2 = moe_inputs(num_tokens, *route, dtype)
    assert_matches(fused_experts(x, weights, ids, w13, w2, PATHS[path]),
                   fused_experts_reference(x, weights, ids, w13, w2))


@pytest.mark.parametrize("block_m", (16, 32))
def test_scan_takes_an_expert_s_pairs_in_several_chunks(block_m):
    """Mixtral at 64 tokens: about 16 pairs per expert, so 16-row chunks loop; 32 rows is plan's choice."""
    x, weights, ids, w13, w2 = moe_inputs(64, *MIXTRAL, torch.float32)
    assert torch.bincount(ids.flatten()).max() > 16
    config = dict(SORTED=False, BLOCK_M=block_m, gate_up=(32, 16), down=(16, 32))
    assert_close(fused_experts(x, weights, ids, w13, w2, config), fused_experts_reference(x, weights, ids, w13, w2))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("num_tokens, route", [(1, QWEN), (5, MIXTRAL), (17, QWEN)])
def test_unchosen_experts_and_padding_rows_are_never_read(num_tokens, route, path):
    x, weights, ids, w13, w2 = moe_inputs(num_tokens, *route, torch.float32)
    unused = sorted(set(range(route[0])) - set(ids.flatten().tolist()))
    assert unused, "the seed should leave an expert unchosen"
    w13[unused], w2[unused] = float("nan"), float("nan")
    got = fused_experts(x, weights, ids, w13, w2, PATHS[path])
    assert torch.isfinite(got).all()
    assert_matches(got, fused_experts_reference(x, weights, ids, w13, w2))


def test_the_k_sum_leaves_the_counters_at_zero_and_repeats_bit_for_bit():
    x, weights, ids, w13, w2 = moe_inputs(8, *QWEN, torch.float32)
    first = fused_experts(x, weights, ids, w13, w2)
    assert not split_k_counters(x.device).any()
    assert torch.equal(first, fused_experts(x, weights, ids, w13, w2))


def test_no_tokens():
    x, weights, ids, w13, w2 = moe_inputs(0, 4, 2, True, torch.float32)
    assert fused_experts(x, weights, ids, w13, w2).shape == (0, HIDDEN)


def test_plan_follows_the_pairs():
    assert plan(1, 8, 128)["BLOCK_M"] == 1 and not plan(1, 8, 128)["SORTED"]  # one token: a GEMV per pair
    assert plan(8, 8, 128)["BLOCK_M"] == 16 and not plan(8, 8, 128)["SORTED"]
    assert plan(64, 2, 8)["BLOCK_M"] == 32  # Mixtral: about 16 pairs per expert
    assert plan(256, 8, 128)["SORTED"] and plan(256, 8, 128)["BLOCK_M"] == 32
    assert plan(4096, 2, 8)["BLOCK_M"] == 64


@pytest.mark.parametrize("num_tokens, launches", [(1, 3), (64, 3), (65, 5)])
def test_launches_per_layer(num_tokens, launches, monkeypatch):
    """Routing, gate/up with SiLU·mul, down with the k-sum; prefill adds the alignment and a k-sum kernel.
    (Before: about 30 small torch kernels for routing and alignment, then 5 more.)"""
    kernel_type = type(fm.moe_experts._gate_up_silu_kernel)
    count, run = [0], kernel_type.run

    def counting_run(self, *args, **kwargs):
        count[0] += 1
        return run(self, *args, **kwargs)

    monkeypatch.setattr(kernel_type, "run", counting_run)
    x, _, _, w13, w2 = moe_inputs(num_tokens, *QWEN, torch.float32)
    logits = randn((num_tokens, QWEN[0]), torch.float32, 9)
    fm.fused_moe(x, logits, w13, w2, 8, True)
    assert count[0] == launches


@pytest.mark.parametrize("route", [QWEN, MIXTRAL, (6, 3, False)])
@pytest.mark.parametrize("num_tokens", (1, 17))
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
def test_whole_op_matches_reference(num_tokens, route, dtype):
    x = randn((num_tokens, HIDDEN), dtype, 0)
    logits = randn((num_tokens, route[0]), torch.float32, 1)  # no ties: CPU torch.topk breaks them its own way
    w13 = randn((route[0], 2 * SIZE, HIDDEN), dtype, 2) * 0.2
    w2 = randn((route[0], HIDDEN, SIZE), dtype, 3) * 0.2
    assert_matches(fm.fused_moe(x, logits, w13, w2, route[1], route[2]),
                   fm.fused_moe_reference(x, logits, w13, w2, route[1], route[2]))


@gpu_only
@pytest.mark.parametrize("num_tokens", (1, 8, 64, 256))
@pytest.mark.parametrize("route, hidden, size", [(QWEN, 2048, 768), (MIXTRAL, 1024, 3584)])
def test_model_shapes(num_tokens, route, hidden, size):
    """Qwen3-30B-A3B's layer (Mixtral's at a quarter width): every path at its real tiles."""
    x, weights, ids, w13, w2 = moe_inputs(num_tokens, *route, torch.bfloat16, hidden=hidden, size=size)
    assert_close(fused_experts(x, weights, ids, w13, w2), fused_experts_reference(x, weights, ids, w13, w2))


@gpu_only
@pytest.mark.parametrize("num_tokens", (1, 8, 96))
def test_replays_in_a_cuda_graph_with_new_routing(num_tokens):
    """Captured once, replayed with other tokens and other experts chosen: no host read, buffers from shapes."""
    x, _, _, w13, w2 = moe_inputs(num_tokens, *QWEN, torch.bfloat16)
    static = [x.clone(), randn((num_tokens, 128), torch.float32, 5)]  # float32 logits: no ties (test_moe_routing)
    fm.fused_moe(*static, w13, w2, 8, True)  # compiles the kernels outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fm.fused_moe(*static, w13, w2, 8, True)
    for seed in (1, 2):
        fresh = [randn((num_tokens, HIDDEN), torch.bfloat16, 10 * seed), randn((num_tokens, 128), torch.float32, seed)]
        for buffer, value in zip(static, fresh):
            buffer.copy_(value)
        graph.replay()
        assert_close(out, fm.fused_moe_reference(*fresh, w13, w2, 8, True))
