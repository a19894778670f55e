"""router_topk (the router's linear and the expert choice in one launch, one token) picks the experts and weights
topk_softmax picks over the router linear's logits, renormalised or not, whichever program arrives last."""

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from graphllm.kernels.moe_router import MAX_EXPERTS, router_topk, router_topk_takes  # noqa: E402
from graphllm.kernels.moe_routing import select_experts_reference, topk_softmax  # noqa: E402
from graphllm.kernels.skinny_matmul import split_k_counters  # noqa: E402
from tests.kernels.conftest import DEVICE, LOW_DTYPE, randn  # noqa: E402

ROUTES = [(128, 8), (8, 2), (6, 3), (64, 6)]  # (experts, top_k): Qwen3-MoE, Mixtral, odd, DeepSeek-V2-Lite


@pytest.mark.parametrize("renormalize", (True, False))
@pytest.mark.parametrize("num_experts, top_k", ROUTES)
@pytest.mark.parametrize("hidden", (64, 512))  # one program (8 experts x 64), and up to 32 of them
def test_float32_matches_topk_of_the_linear(hidden, num_experts, top_k, renormalize):
    x = randn((1, hidden), torch.float32, hidden + num_experts)
    w = randn((num_experts, hidden), torch.float32, top_k) / hidden ** 0.5 * 4
    weights, ids = router_topk(x, w, top_k, renormalize)
    ref_weights, ref_ids = select_experts_reference(F.linear(x, w), top_k, renormalize)
    assert weights.dtype == torch.float32 and ids.dtype == torch.int32 and ids.shape == (1, top_k)
    assert torch.equal(ids.long(), ref_ids)
    torch.testing.assert_close(weights, ref_weights, atol=1e-6, rtol=1e-5)
    assert not split_k_counters(DEVICE).any()  # the last program left its counter at zero


def test_half_precision_rounds_the_logits_as_the_linear_does():
    """The partial sums are rounded to x's dtype before the choice, as graphllm.linear's output is: the ids equal
    topk_softmax's over the linear's half-precision logits wherever no tie within rounding sits at the k-th."""
    clear = 0
    for seed in range(12):
        x = randn((1, 256), torch.float32, seed).to(LOW_DTYPE)
        w = (randn((128, 256), torch.float32, 100 + seed) / 4).to(LOW_DTYPE)
        weights, ids = router_topk(x, w, 8, True)
        logits = (x.float() @ w.float().T).to(LOW_DTYPE)  # float32 sums, one rounding
        ref_weights, ref_ids = topk_softmax(logits, 8, True)
        values = logits.float().sort(-1, descending=True).values[0]
        if values[7] > values[8]:
            clear += 1
            assert torch.equal(ids.sort(-1).values, ref_ids.sort(-1).values)
            torch.testing.assert_close(weights.sort(-1).values, ref_weights.sort(-1).values, atol=1e-3, rtol=1e-3)
    assert clear >= 6


def test_equal_logits_go_to_the_lower_expert_first():
    """An identity router hands the logits through exactly: ties rank by index, as topk_softmax's rounds do."""
    for row, expected in (([0.0, 3.0, 1.0, 3.0, 1.0, 1.0], [1, 3, 2]), ([2.0] * 6, [0, 1, 2])):
        x = torch.tensor([row], device=DEVICE)
        weights, ids = router_topk(x, torch.eye(6, device=DEVICE), 3, False)
        ref_weights, ref_ids = topk_softmax(x, 3, False)
        assert ids.tolist() == [expected] == ref_ids.tolist()
        torch.testing.assert_close(weights, ref_weights)


def test_what_takes_one_launch():
    w = torch.zeros((MAX_EXPERTS, 64), device=DEVICE)
    assert router_topk_takes(torch.zeros((1, 64), device=DEVICE), w)
    assert not router_topk_takes(torch.zeros((2, 64), device=DEVICE), w)  # batches: the router's own linear
    assert not router_topk_takes(torch.zeros((1, 64), device=DEVICE), torch.zeros((MAX_EXPERTS * 2, 64),
                                                                                  device=DEVICE))
    assert not router_topk_takes(torch.zeros((1, 64), device=DEVICE, dtype=torch.float16), w)
