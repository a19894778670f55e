"""Fused mixture-of-experts in Triton: graphllm.fused_moe on CUDA, three launches per MoE layer at decode
sizes (T*k <= DECODE_MAX_PAIRS), five at prefill:

    topk_softmax(router_logits)        topk_weights [T, k] float32, topk_ids [T, k] int32   moe_routing.py
    (prefill) moe_align_block_size     pairs sorted by expert, padded per BLOCK_M           moe_align.py
    gate_up_silu(x, w13)               act [T*k, I] = silu(gate) * up                       moe_experts.py
    down_weighted(act, w2)             out [T, H]   decode: the k-sum done in the kernel     moe_experts.py
    (prefill) sum_over_k(terms)        out [T, H]

Every buffer and grid is sized from shapes alone (no host read), so the op runs inside a CUDA graph. The
oracle is fused_moe_reference.py (tests/kernels/test_fused_moe.py). graphllm.fused_moe_fp8 runs the same
launches over float8_e4m3fn experts with their per-channel scales (w13_scale, w2_scale; moe_experts.py says
how), with the same tiles: not tuned for float8 (a tile then holds half the bytes), never run on a GPU.

Tiles (plan): at decode the op only streams the chosen experts' weights (Qwen3-30B-A3B at one token: 8 x
(6.3 MB gate/up + 3.1 MB down) = 75 MB a layer, 18 us at 4.2 TB/s), so the tiles are chosen for enough
programs in flight, not for reuse. One token: the k experts differ, one pair per program, multiply-add
over [16, 256] weight tiles, 4 warps, 4 stages (skinny_matmul's measured one-row shape on the H200): the
gate/up grid is k x I/16 (384 programs of 128 KB at Qwen3's shape), the down grid k x H/16 (1024 of 24
KB). More tokens: each expert's pairs in BLOCK_M-row dots (16 rows, more when T*k / E is large: Mixtral),
32 x 128 weight tiles. Prefill (sorted rows): vLLM's large default, 64-column tiles, BLOCK_M 16..64 by
pairs per expert. These are reasoned, not yet swept: benchmarks/moe_kernel_bench.py times them.
"""

import functools

import torch
import triton

from graphllm.kernels import moe_experts
from graphllm.kernels.fused_moe_reference import reference_fused_experts, reference_fused_moe
from graphllm.kernels.launch import pdl_launch
from graphllm.kernels.moe_align import moe_align_block_size
from graphllm.kernels.moe_routing import topk_softmax
from graphllm.kernels.quant_layout import FP8_DTYPE
from graphllm.kernels.skinny_matmul import MAX_COLUMN_TILES, split_k_counters

DECODE_MAX_PAIRS = 512  # T*k up to this scan topk_ids in the GEMMs (no alignment step); more: sorted rows
SUM_TOKENS, SUM_COLUMNS = 16, 128  # tokens and columns per program of the k-sum


def fused_experts_reference(x, topk_weights, topk_ids, w13, w2) -> torch.Tensor:
    """The PyTorch oracle (fused_moe_reference.reference_fused_experts)."""
    return reference_fused_experts(x, topk_weights, topk_ids, w13, w2)


def fused_moe_reference(x, router_logits, w13, w2, top_k: int, renormalize: bool) -> torch.Tensor:
    """The PyTorch oracle of the whole op (fused_moe_reference.reference_fused_moe)."""
    return reference_fused_moe(x, router_logits, w13, w2, top_k, renormalize)


def plan(num_tokens: int, top_k: int, num_experts: int) -> dict:
    """Row source and tiles of a step (module docstring): SORTED, BLOCK_M, gate_up / down (BLOCK_N,
    BLOCK_K), num_warps, num_stages."""
    pairs = num_tokens * top_k
    if pairs <= DECODE_MAX_PAIRS and num_tokens == 1:
        return dict(SORTED=False, BLOCK_M=1, gate_up=(16, 256), down=(16, 256), num_warps=4, num_stages=4,
                    early_down=False)  # moe_experts.py's EARLY: off until moe_kernel_bench's A/B under PDL
    if pairs <= DECODE_MAX_PAIRS:
        per_expert = -(-pairs // min(pairs, num_experts))  # mean pairs of a used expert
        block_m = min(64, max(16, triton.next_power_of_2(2 * per_expert)))
        return dict(SORTED=False, BLOCK_M=block_m, gate_up=(32, 128), down=(32, 128), num_warps=4, num_stages=4)
    block_m = min(64, max(16, triton.next_power_of_2(2 * pairs // num_experts)))
    return dict(SORTED=True, BLOCK_M=block_m, gate_up=(64, 64), down=(64, 64), num_warps=4, num_stages=3)


def _row_source(topk_ids: torch.Tensor, num_experts: int, config: dict) -> tuple[int, tuple, dict]:
    """(programs along the rows, the row-source tensors, their constexprs) for config's SORTED."""
    flat_ids = topk_ids.reshape(-1)
    pairs = flat_ids.numel()
    if config["SORTED"]:
        alignment = moe_align_block_size(topk_ids, num_experts, config["BLOCK_M"])  # sorted, expert, num_padded
        return alignment[1].numel(), (flat_ids, *alignment), dict(SORTED=True, BY_EXPERT=False, PAIRS=1)
    slots = min(pairs, num_experts)
    flags = dict(SORTED=False, BY_EXPERT=num_experts <= pairs, PAIRS=triton.next_power_of_2(pairs))
    return slots, (flat_ids, flat_ids, flat_ids, flat_ids), flags


def fused_experts(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, w13: torch.Tensor,
                  w2: torch.Tensor, config: dict | None = None, w13_scale: torch.Tensor | None = None,
                  w2_scale: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, H], topk_weights [T, k] float32, topk_ids [T, k] int, w13 [E, 2I, H], w2 [E, H, I] (any strides)
    -> a new [T, H] in x's dtype (fused_experts_reference's function). config: plan's keys, to override.
    float8_e4m3fn w13 / w2 come with their float32 scales w13_scale [E, 2I], w2_scale [E, H] (the weights
    dequantized per output channel: fused_moe_reference.dequantize_experts); float weights with none."""
    assert (w13.dtype == FP8_DTYPE) == (w13_scale is not None) and (w2.dtype == FP8_DTYPE) == (w2_scale is not None)
    num_tokens, top_k = topk_ids.shape
    num_experts, hidden, size = w2.shape
    out = x.new_empty((num_tokens, hidden))
    if num_tokens == 0:
        return out
    config = {**plan(num_tokens, top_k, num_experts), **(config or {})}
    block_m = config["BLOCK_M"]
    assert block_m == 1 and num_tokens == 1 or block_m >= 16 and min(config["gate_up"] + config["down"]) >= 16
    x = x if x.stride(1) == 1 else x.contiguous()
    topk_ids = topk_ids.to(torch.int32).contiguous()  # no copy when the routing kernel made them
    weights = topk_weights.to(torch.float32).contiguous().reshape(-1)  # [T*k]
    pairs = num_tokens * top_k
    slots, rows, flags = _row_source(topk_ids, num_experts, config)
    launch = pdl_launch(x.device)
    early = launch["PDL"] and config.get("early_down", False) and block_m == 1 and fits_l2(w2, top_k)
    common = dict(TOP_K=top_k, BLOCK_M=block_m, DOT_FP32=not x.is_cuda, **flags,
                  PRECISION="ieee" if x.dtype == torch.float32 else "tf32", EARLY=early,
                  num_warps=config["num_warps"], num_stages=config["num_stages"], **launch)
    act = x.new_empty((pairs, size))  # [T*k, I]
    block_n, block_k = config["gate_up"]
    moe_experts._gate_up_silu_kernel[(slots, triton.cdiv(size, block_n))](
        x, w13, _dense(w13_scale), act, *rows, pairs, size, hidden, x.stride(0), *w13.stride(), BLOCK_N=block_n,
        BLOCK_K=block_k, **common)
    terms = x.new_empty((pairs, hidden))  # [T*k, H] each pair's weighted down projection
    block_n, block_k = config["down"]
    tiles = triton.cdiv(hidden, block_n)
    assert config["SORTED"] or tiles <= MAX_COLUMN_TILES, tiles
    counters = out if config["SORTED"] else split_k_counters(x.device)
    moe_experts._down_weighted_kernel[(slots, tiles)](
        act, w2, _dense(w2_scale), weights, terms, out, counters, *rows, pairs, num_tokens, hidden, size,
        *w2.stride(), out.stride(0), BLOCK_N=block_n, BLOCK_K=block_k, BLOCK_T=SUM_TOKENS, **common)
    if config["SORTED"]:
        moe_experts._sum_over_k_kernel[(triton.cdiv(num_tokens, SUM_TOKENS), triton.cdiv(hidden, SUM_COLUMNS))](
            terms, out, num_tokens, hidden, out.stride(0), TOP_K=top_k, BLOCK_T=SUM_TOKENS, BLOCK_N=SUM_COLUMNS,
            **pdl_launch(x.device))
    return out


def fits_l2(w2: torch.Tensor, top_k: int) -> bool:
    """Whether one token's k down projections fit half the device's L2 (Qwen3-30B-A3B's 25 MB of an H100's or
    H200's 50 MB; not Mixtral's 235 MB): then, under PDL, down_weighted fetches them into L2 while gate_up_silu
    streams (moe_experts.py's EARLY)."""
    _, hidden, size = w2.shape
    return w2.is_cuda and 2 * top_k * hidden * size * w2.element_size() <= _l2_bytes(w2.device)


@functools.lru_cache(maxsize=None)
def _l2_bytes(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).L2_cache_size


def _dense(scale: torch.Tensor | None) -> torch.Tensor | None:
    """A scale [E, N] as the kernels index it (row e*N + n), or None."""
    return scale if scale is None or scale.is_contiguous() else scale.contiguous()


def fused_moe(x: torch.Tensor, router_logits: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, top_k: int,
              renormalize: bool, config: dict | None = None, w13_scale: torch.Tensor | None = None,
              w2_scale: torch.Tensor | None = None) -> torch.Tensor:
    """graphllm.fused_moe's computation (ops/moe.py), and graphllm.fused_moe_fp8's with the scales of float8
    experts: routing, then fused_experts. [T, H] -> [T, H]."""
    logits = router_logits if router_logits.stride(1) == 1 else router_logits.contiguous()
    topk_weights, topk_ids = topk_softmax(logits, top_k, renormalize)
    return fused_experts(x, topk_weights, topk_ids, w13, w2, config, w13_scale, w2_scale)
