"""One token's MoE routing in one Triton launch: the router's linear and the expert choice together.

    logits       = x @ W^T            [E]  float32 sums, rounded to x's dtype (graphllm.linear's output)
    weights, ids = topk_softmax(logits) [k] float32, int32 (moe_routing.py's choice and weights)

At batch 1 a MoE layer routes in two launches before its experts: the router's GEMV (0.5 MB of weight at
Qwen3-30B-A3B's 128 x 2048) and topk_softmax's one-warp program. Each pays a launch, a ramp and a tail for
almost no bytes (s32: the GEMV 3.7-5.8 us in an H100 kernel sweep, topk_softmax 2.2 us a layer in the H200's
no-PDL profile, of a ~66 us layer). Here cdiv(H, BLOCK_K) programs each take BLOCK_K columns of all E rows and
store their float32 partial sums; the program that brings the arrival counter to the program count sums the
partials in split order, rounds them as the linear's output is rounded, chooses, and resets the counter
(skinny_matmul's shared zeroed counters): the same sums whichever program arrives last.

The choice is topk_softmax's own (moe_routing.choose_topk: k rounds of one reduction each over keys that order
as the logits, ties to the lower index), so the ids and weights are topk_softmax's over the same logits. Up to
MAX_EXPERTS experts (the last program holds all partials in registers); more go through the two launches
(router_topk_takes).
"""

import torch
import triton
import triton.language as tl

from graphllm.kernels.gdc import dependent_start, weight_lines
from graphllm.kernels.launch import pdl_launch
from graphllm.kernels.moe_routing import choose_topk, key_low_bits
from graphllm.kernels.skinny_matmul import split_k_counters

MAX_EXPERTS = 256  # the last program's partials [splits, E] at 4 warps
TILE_ELEMENTS = 8192  # weight elements a program: BLOCK_K = TILE_ELEMENTS / E (Qwen3-30B-A3B: 64, 32 programs)
MAX_SPLITS = 128  # programs at most: the last one's partials [splits, E] stay in registers


@triton.jit
def _router_topk_kernel(x_ptr, w_ptr, part_ptr, counter_ptr, weights_ptr, ids_ptr, num_experts, hidden, stride_we,
                        TOP_K: tl.constexpr, RENORMALIZE: tl.constexpr, E_POW2: tl.constexpr, K_POW2: tl.constexpr,
                        SPLITS_POW2: tl.constexpr, BLOCK_K: tl.constexpr, LOW_BITS: tl.constexpr = 0,
                        PDL: tl.constexpr = False):
    split = tl.program_id(0)
    offs_e = tl.arange(0, E_POW2)
    offs_k = split * BLOCK_K + tl.arange(0, BLOCK_K)
    e_mask = offs_e < num_experts
    if PDL:  # the router's weight is the model's: its first step is fetched into L2 before the wait
        dependent_start(weight_lines(w_ptr, offs_e, num_experts, split * BLOCK_K, stride_we, BLOCK_K))
    w = tl.load(w_ptr + offs_e.to(tl.int64)[:, None] * stride_we + offs_k[None, :],
                mask=e_mask[:, None] & (offs_k < hidden)[None, :], other=0.0)  # [E_POW2, BLOCK_K]
    x = tl.load(x_ptr + offs_k, mask=offs_k < hidden, other=0.0)  # [BLOCK_K]
    tl.store(part_ptr + split * E_POW2 + offs_e, tl.sum(w.to(tl.float32) * x.to(tl.float32)[None, :], axis=1))
    tl.debug_barrier()  # every thread's partials are stored before the arrival is counted
    splits = tl.num_programs(0)
    if tl.atomic_add(counter_ptr, 1, sem="acq_rel") == splits - 1:  # the last program: sum, round, choose
        rows = tl.arange(0, SPLITS_POW2)
        parts = tl.load(part_ptr + rows[:, None] * E_POW2 + offs_e[None, :], mask=(rows < splits)[:, None],
                        other=0.0, cache_modifier=".cg")  # [SPLITS_POW2, E_POW2]
        logits = tl.sum(parts, axis=0).to(x_ptr.dtype.element_ty).to(tl.float32)  # the linear's rounding
        weights, ids = choose_topk(tl.where(e_mask, logits, float("-inf")), offs_e, num_experts, TOP_K, RENORMALIZE,
                                   E_POW2, K_POW2, LOW_BITS)
        slots = tl.arange(0, K_POW2)
        tl.store(weights_ptr + slots, weights, mask=slots < TOP_K)
        tl.store(ids_ptr + slots, ids, mask=slots < TOP_K)
        tl.atomic_xchg(counter_ptr, 0)


def router_topk_takes(x: torch.Tensor, w_router: torch.Tensor) -> bool:
    """One launch for this routing: one token, up to MAX_EXPERTS experts, a dense weight in x's dtype."""
    return (x.shape[0] == 1 and x.stride(-1) == 1 and w_router.shape[0] <= MAX_EXPERTS and w_router.stride(1) == 1
            and w_router.dtype == x.dtype and triton.cdiv(x.shape[1], _block_k(w_router.shape[0])) <= MAX_SPLITS)


def _block_k(num_experts: int) -> int:
    return max(16, TILE_ELEMENTS // triton.next_power_of_2(num_experts))


def router_topk(x: torch.Tensor, w_router: torch.Tensor, top_k: int, renormalize: bool
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """x [1, H], w_router [E, H] -> (topk_weights [1, k] float32, topk_ids [1, k] int32): topk_softmax of
    linear(x, w_router), in one launch (router_topk_takes says when)."""
    num_experts, hidden = w_router.shape
    assert router_topk_takes(x, w_router) and 0 < top_k <= num_experts, (tuple(x.shape), tuple(w_router.shape))
    e_pow2, block_k = triton.next_power_of_2(num_experts), _block_k(num_experts)
    splits = triton.cdiv(hidden, block_k)
    parts = torch.empty((splits, e_pow2), dtype=torch.float32, device=x.device)
    weights = torch.empty((1, top_k), dtype=torch.float32, device=x.device)
    ids = torch.empty((1, top_k), dtype=torch.int32, device=x.device)
    _router_topk_kernel[(splits,)](
        x, w_router, parts, split_k_counters(x.device), weights, ids, num_experts, hidden, w_router.stride(0),
        TOP_K=top_k, RENORMALIZE=renormalize, E_POW2=e_pow2, K_POW2=triton.next_power_of_2(top_k),
        SPLITS_POW2=triton.next_power_of_2(splits), BLOCK_K=block_k, LOW_BITS=key_low_bits(x.dtype, num_experts),
        num_warps=4, **pdl_launch(x.device))
    return weights, ids
