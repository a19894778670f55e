"""The MoE router's expert choice in one Triton kernel: softmax, top-k and renormalisation per token.

    probs      = softmax(router_logits[t], float32)              # [E]
    ids        = the top_k experts by probability                 # [k] int32, best first
    weights    = probs[ids] (/ their sum when renormalize)         # [k] float32

The oracle is fused_moe_reference.select_experts (torch.softmax, torch.topk). Program t takes token t's
whole row (E up to a few thousand fits one program) and picks in k rounds of argmax-and-mask.

Choice: by the float32 logits, which softmax orders as it orders the probabilities, so rounding in exp
cannot reorder two experts (only where two different logits round to one probability may torch pick
otherwise). Equal logits (equal probabilities: frequent with bfloat16 logits) go to the lower expert
index first, the set CUDA's torch.topk keeps at the boundary (its gather takes the values above the k-th,
then the equal ones in index order; a GPU test checks it); CPU torch.topk's choice among equal values is
unspecified. NaN logits come first, as in torch.topk. The weights are torch's formula, exp(l - max) / sum,
with Triton's exp: within a few float32 ulps of torch.softmax.
"""

import torch
import triton
import triton.language as tl

from graphllm.kernels.fused_moe_reference import select_experts
from graphllm.kernels.gdc import dependent_start
from graphllm.kernels.launch import pdl_launch


def select_experts_reference(router_logits: torch.Tensor, top_k: int, renormalize: bool):
    """The PyTorch oracle: (topk_weights [T, k] float32, topk_ids [T, k] int64)."""
    return select_experts(router_logits, top_k, renormalize)


@triton.jit
def _topk_softmax_kernel(logits_ptr, weights_ptr, ids_ptr, num_experts, stride_t,
                         TOP_K: tl.constexpr, RENORMALIZE: tl.constexpr, E_POW2: tl.constexpr,
                         K_POW2: tl.constexpr, PDL: tl.constexpr = False):
    if PDL:  # launched as a programmatic dependent (launch.py): nothing is read before the kernels before are done
        dependent_start()
    token = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, E_POW2)
    in_row = offs < num_experts
    logits = tl.load(logits_ptr + token * stride_t + offs, mask=in_row, other=float("-inf")).to(tl.float32)
    shifted = tl.exp(logits - tl.max(logits, axis=0))  # [E_POW2], 0 past the row
    probs = shifted / tl.sum(shifted, axis=0)
    slots = tl.arange(0, K_POW2)
    weights = tl.zeros([K_POW2], dtype=tl.float32)
    ids = tl.zeros([K_POW2], dtype=tl.int32)
    keys = tl.where(logits != logits, float("inf"), logits)  # NaN first, as torch.topk orders it
    for j in tl.static_range(TOP_K):
        best = tl.min(tl.where(keys == tl.max(keys, axis=0), offs, E_POW2), axis=0)  # lowest index of the max
        best = tl.minimum(best, num_experts - 1)  # never an expert past the row, whatever the logits
        chosen = offs == best
        weights = tl.where(slots == j, tl.sum(tl.where(chosen, probs, 0.0), axis=0), weights)
        ids = tl.where(slots == j, best, ids)
        keys = tl.where(chosen, float("-inf"), keys)
    if RENORMALIZE:
        weights = weights / tl.sum(weights, axis=0)
    out = token * TOP_K + slots
    tl.store(weights_ptr + out, weights, mask=slots < TOP_K)
    tl.store(ids_ptr + out, ids, mask=slots < TOP_K)


def topk_softmax(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits [T, E] (last-dim stride 1) -> (topk_weights [T, k] float32, topk_ids [T, k] int32)."""
    num_tokens, num_experts = router_logits.shape
    assert router_logits.stride(1) == 1 and 0 < top_k <= num_experts, (router_logits.stride(), top_k)
    weights = torch.empty((num_tokens, top_k), dtype=torch.float32, device=router_logits.device)
    ids = torch.empty((num_tokens, top_k), dtype=torch.int32, device=router_logits.device)
    if num_tokens == 0:
        return weights, ids
    _topk_softmax_kernel[(num_tokens,)](
        router_logits, weights, ids, num_experts, router_logits.stride(0), TOP_K=top_k, RENORMALIZE=renormalize,
        E_POW2=triton.next_power_of_2(num_experts), K_POW2=triton.next_power_of_2(top_k),
        num_warps=1 if num_experts <= 256 else 4, **pdl_launch(router_logits.device))
    return weights, ids
