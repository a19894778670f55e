"""The MoE router's expert choice in one Triton kernel: softmax, top-k and renormalisation per token.

    probs      = softmax(router_logits[t], float32)              # [E]
    ids        = the top_k experts by probability                 # [k] int32, best first
    weights    = probs[ids] (/ their sum when renormalize)         # [k] float32

The oracle is fused_moe_reference.select_experts (torch.softmax, torch.topk). Program t takes token t's
whole row (E up to a few thousand fits one program) and picks in k rounds of argmax-and-mask (choose_topk, which
moe_router.py's one-token router launch shares): each round is one reduction, over an integer key per expert that
orders as the logit and, below it, the reversed index (int32 for half-precision logits, int64 for float32), so the
largest key is the lowest index among the largest logits; the chosen probabilities are gathered once after the
rounds. (Three reductions a round before: the max,
the lowest index at it, the probability there.)

Choice: by the float32 logits, which softmax orders as it orders the probabilities, so rounding in exp
cannot reorder two experts (only where two different logits round to one probability may torch pick
otherwise). Equal logits (equal probabilities: frequent with bfloat16 logits) go to the lower expert
index first, the set CUDA's torch.topk keeps at the boundary (its gather takes the values above the k-th,
then the equal ones in index order; a GPU test checks it); CPU torch.topk's choice among equal values is
unspecified. -0.0 and 0.0 are equal logits. NaN logits come first, as in torch.topk. The weights are torch's
formula, exp(l - max) / sum, with Triton's exp: within a few float32 ulps of torch.softmax.
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


INDEX_SPAN = tl.constexpr(65536)  # float32 logits' int64 keys: the reversed index below the logit's bits
CHOSEN = tl.constexpr(-(2 ** 62))  # below every int64 key (the logit's bits shifted: at least -2**47)
CHOSEN_32 = tl.constexpr(-(2 ** 31))  # below every int32 key (-inf's: (-32641 << 16) + index)
LOW_BITS = {torch.bfloat16: 16, torch.float16: 13}  # float32 bits that are zero in a widened half-precision value


def key_low_bits(dtype: torch.dtype, num_experts: int) -> int:
    """choose_topk's LOW_BITS for logits of dtype: the zero low bits that int32 keys give to the index (half
    precision, when the index fits them); 0: int64 keys."""
    low = LOW_BITS.get(dtype, 0)
    return low if triton.next_power_of_2(num_experts) <= 2 ** low else 0


@triton.jit
def _order_keys(logits, offs, E_POW2: tl.constexpr, LOW_BITS: tl.constexpr):
    """[E_POW2] integers that order as (logit, then lower index first): NaN as +inf (torch.topk puts it first), -0.0
    as 0.0, the float's bits made to order as signed integers (negative floats' magnitude bits flipped), the index
    reversed below them. LOW_BITS > 0 (half-precision logits, whose widened bits below LOW_BITS are zero): int32
    keys with the index in those bits, so each round's reduction moves one word, not two; 0: int64 keys."""
    keys = tl.where(logits != logits, float("inf"), tl.where(logits == 0, 0.0, logits))
    bits = keys.to(tl.int32, bitcast=True)
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    if LOW_BITS > 0:
        order = ((ordered >> LOW_BITS) << LOW_BITS) + (E_POW2 - 1 - offs)
    else:
        order = ordered.to(tl.int64) * INDEX_SPAN + (E_POW2 - 1 - offs)
    return order


@triton.jit
def choose_topk(logits, offs, num_experts, TOP_K: tl.constexpr, RENORMALIZE: tl.constexpr, E_POW2: tl.constexpr,
                K_POW2: tl.constexpr, LOW_BITS: tl.constexpr):
    """logits [E_POW2] float32, -inf past the row; offs = arange(E_POW2) -> (weights [K_POW2] float32, ids [K_POW2]
    int32), best first; slots from TOP_K on hold zeros. LOW_BITS: key_low_bits of the logits' own dtype."""
    shifted = tl.exp(logits - tl.max(logits, axis=0))  # [E_POW2], 0 past the row
    probs = shifted / tl.sum(shifted, axis=0)
    order = _order_keys(logits, offs, E_POW2, LOW_BITS)
    slots = tl.arange(0, K_POW2)
    ids = tl.zeros([K_POW2], dtype=tl.int32)
    for j in tl.static_range(TOP_K):
        best = tl.max(order, axis=0)
        ids = tl.where(slots == j, (E_POW2 - 1 - (best & (E_POW2 - 1))).to(tl.int32), ids)
        order = tl.where(order == best, CHOSEN_32 if LOW_BITS > 0 else CHOSEN, order)
    ids = tl.minimum(ids, num_experts - 1)  # never an expert past the row, whatever the logits
    picked = (offs[None, :] == ids[:, None]) & (slots < TOP_K)[:, None]  # [K_POW2, E_POW2]
    weights = tl.sum(tl.where(picked, probs[None, :], 0.0), axis=1)
    if RENORMALIZE:
        weights = weights / tl.sum(weights, axis=0)
    return weights, ids


@triton.jit
def _topk_softmax_kernel(logits_ptr, weights_ptr, ids_ptr, num_experts, stride_t,
                         TOP_K: tl.constexpr, RENORMALIZE: tl.constexpr, E_POW2: tl.constexpr,
                         K_POW2: tl.constexpr, LOW_BITS: tl.constexpr = 0, PDL: tl.constexpr = False):
    if PDL:  # launched as a programmatic dependent (launch.py): nothing is read before the kernels before are done
        dependent_start()
    token = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, E_POW2)
    logits = tl.load(logits_ptr + token * stride_t + offs, mask=offs < num_experts, other=float("-inf")).to(tl.float32)
    weights, ids = choose_topk(logits, offs, num_experts, TOP_K, RENORMALIZE, E_POW2, K_POW2, LOW_BITS)
    slots = tl.arange(0, K_POW2)
    out = token * TOP_K + slots
    tl.store(weights_ptr + out, weights, mask=slots < TOP_K)
    tl.store(ids_ptr + out, ids, mask=slots < TOP_K)


def topk_softmax(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits [T, E] (last-dim stride 1) -> (topk_weights [T, k] float32, topk_ids [T, k] int32)."""
    num_tokens, num_experts = router_logits.shape
    assert router_logits.stride(1) == 1 and 0 < top_k <= num_experts <= 65536, (router_logits.stride(), top_k)
    weights = torch.empty((num_tokens, top_k), dtype=torch.float32, device=router_logits.device)
    ids = torch.empty((num_tokens, top_k), dtype=torch.int32, device=router_logits.device)
    if num_tokens == 0:
        return weights, ids
    _topk_softmax_kernel[(num_tokens,)](
        router_logits, weights, ids, num_experts, router_logits.stride(0), TOP_K=top_k, RENORMALIZE=renormalize,
        E_POW2=triton.next_power_of_2(num_experts), K_POW2=triton.next_power_of_2(top_k),
        LOW_BITS=key_low_bits(router_logits.dtype, num_experts), num_warps=1 if num_experts <= 256 else 4, **pdl_launch(router_logits.device))
    return weights, ids
