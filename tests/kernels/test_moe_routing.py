"""topk_softmax (one Triton program per token) picks the experts torch.topk picks on the float32 softmax,
with the same weights, renormalised or not, at Qwen3-MoE's and Mixtral's router widths."""

import pytest
import torch

pytest.importorskip("triton")

from graphllm.kernels.moe_routing import select_experts_reference, topk_softmax  # noqa: E402
from tests.kernels.conftest import DEVICE, gpu_only, randn  # noqa: E402

ROUTES = [(128, 8), (8, 2), (6, 3), (256, 8), (4, 4)]  # (experts, top_k)


@pytest.mark.parametrize("renormalize", (True, False))
@pytest.mark.parametrize("num_experts, top_k", ROUTES)
@pytest.mark.parametrize("num_tokens", (1, 3, 17, 64))
def test_matches_torch_topk_of_the_float32_softmax(num_tokens, num_experts, top_k, renormalize):
    logits = randn((num_tokens, num_experts), torch.float32, num_tokens) * 2  # float32: no ties
    weights, ids = topk_softmax(logits, top_k, renormalize)
    ref_weights, ref_ids = select_experts_reference(logits, top_k, renormalize)
    assert weights.dtype == torch.float32 and ids.dtype == torch.int32 and ids.shape == (num_tokens, top_k)
    assert torch.equal(ids.long(), ref_ids)
    torch.testing.assert_close(weights, ref_weights, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16))
def test_half_precision_logits_are_read_as_float32(dtype):
    """Half-precision logits tie often; where torch.topk's choice is unambiguous (no tie at the k-th value)
    the choice and the weights equal it."""
    logits = randn((64, 128), torch.float32, 7).to(dtype)
    weights, ids = topk_softmax(logits, 8, True)
    ref_weights, ref_ids = select_experts_reference(logits, 8, True)
    values = logits.float().sort(-1, descending=True).values
    clear = values[:, 7] > values[:, 8]  # [T] no tie at the boundary
    assert clear.sum() > 32
    assert torch.equal(ids.long()[clear].sort(-1).values, ref_ids[clear].sort(-1).values)
    torch.testing.assert_close(weights.sort(-1).values[clear], ref_weights.sort(-1).values[clear],
                               atol=1e-6, rtol=1e-5)


def test_equal_probabilities_go_to_the_lower_expert_first():
    logits = torch.tensor([[0.0, 3.0, 1.0, 3.0, 1.0, 1.0], [2.0, 2.0, 2.0, 2.0, 2.0, 2.0]], device=DEVICE)
    weights, ids = topk_softmax(logits, 3, False)
    assert ids.tolist() == [[1, 3, 2], [0, 1, 2]]
    torch.testing.assert_close(weights[1], torch.full((3,), 1 / 6, device=DEVICE))
    weights, _ = topk_softmax(logits, 3, True)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, device=DEVICE))


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16, torch.float16))  # int64 keys; int32 keys
def test_nan_first_and_signed_zeros_equal(dtype):
    """The keys order NaN above every logit (torch.topk's order) and -0.0 with 0.0 (by index), in each key width."""
    logits = torch.tensor([[1.0, float("nan"), 3.0, 2.0], [-0.0, 0.0, -1.0, -2.0], [0.0, -0.0, -3.0, -1.0],
                           [-1.0, -2.0, float("-inf"), -3.0]], device=DEVICE).to(dtype)
    _, ids = topk_softmax(logits, 2, False)
    assert ids.tolist() == [[1, 2], [0, 1], [0, 1], [0, 1]]
    _, ids = topk_softmax(logits[3:], 4, False)
    assert ids.tolist() == [[0, 1, 3, 2]]  # -inf last


def test_row_stride_and_no_tokens():
    logits = randn((5, 16), torch.float32, 3)
    wide = torch.zeros((5, 40), device=DEVICE)
    wide[:, 8:24] = logits
    assert torch.equal(topk_softmax(wide[:, 8:24], 4, True)[1], topk_softmax(logits, 4, True)[1])
    weights, ids = topk_softmax(logits[:0], 4, True)
    assert weights.shape == ids.shape == (0, 4)


@gpu_only
def test_ties_choose_the_set_cuda_torch_topk_chooses():
    """bfloat16 router logits tie at the k-th value often: the kernel keeps the same experts as torch.topk on
    CUDA (the lowest indices among the tied), so routing is unchanged from the torch path."""
    logits = (randn((4096, 128), torch.float32, 11) * 2).to(torch.bfloat16)
    _, ids = topk_softmax(logits, 8, True)
    _, ref_ids = select_experts_reference(logits, 8, True)
    assert torch.equal(ids.long().sort(-1).values, ref_ids.sort(-1).values)
