"""The pure-PyTorch mixture-of-experts: what graphllm.fused_moe runs on CPU and the oracle of the Triton
kernel (graphllm/kernels/fused_moe.py). Plain torch, no triton.

Semantics are vLLM's fused_moe (and transformers' Mixtral / Qwen3-MoE blocks):

    probs   = softmax(router_logits, float32)                   # [T, E]
    w, ids  = topk(probs, k)                                     # [T, k] float32, [T, k] int64
    w       = w / w.sum(-1)          if renormalize              # Mixtral always; Qwen3-MoE: norm_topk_prob
    out[t]  = sum_j w[t, j] * down_e(silu(gate_e(x[t])) * up_e(x[t]))   with e = ids[t, j]

Expert weights are stacked: w13 [E, 2I, H] holds each expert's gate rows then its up rows, w2 [E, H, I]
its down projection. Rounding: each expert's projections run in x's dtype (as the Hugging Face modules do);
each weighted term is rounded to x's dtype, the k terms are summed in float32, the sum cast once.

fp8 experts (graphllm.fused_moe_fp8) are quant_layout's per-channel fp8 layout per expert: w float8_e4m3fn
[E, N, K] with a float32 scale [E, N] per output row, W[e, n, k] = w[e, n, k] * scale[e, n]. Their
reference dequantizes to x's dtype and runs the float one.
"""

import torch
import torch.nn.functional as F

from graphllm.kernels.quant_layout import dequantize_per_channel, quantize_fp8_weight


def select_experts(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits [T, E] -> (topk_weights [T, k] float32, topk_ids [T, k] int64), on the logits' device."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)  # [T, E]
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def reference_fused_experts(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                            w13: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """x [T, H], topk_weights [T, k], topk_ids [T, k], w13 [E, 2I, H], w2 [E, H, I] -> [T, H] in x's dtype.

    One pass over the experts that some token chose: its tokens gathered (index_select), run through the
    expert, weighted and added back (index_add). The per-expert token counts are read on the host once.
    """
    num_tokens, top_k = topk_ids.shape
    size = w2.shape[2]
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)  # [T, H]
    if num_tokens == 0:
        return out.to(x.dtype)
    flat_ids = topk_ids.reshape(-1)  # [T*k]; pair p is token p // k's choice p % k
    pairs_by_expert = torch.argsort(flat_ids, stable=True)  # [T*k]
    counts = torch.bincount(flat_ids, minlength=w13.shape[0]).tolist()  # host read: CPU path only
    flat_weights = topk_weights.reshape(-1)
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        pairs = pairs_by_expert[start:start + count]  # [n]
        start += count
        tokens = pairs // top_k
        h = F.linear(x.index_select(0, tokens), w13[expert])  # [n, 2I]
        y = F.linear(F.silu(h[:, :size]) * h[:, size:], w2[expert])  # [n, H]
        weighted = (y.float() * flat_weights.index_select(0, pairs)[:, None]).to(x.dtype)
        out.index_add_(0, tokens, weighted.float())
    return out.to(x.dtype)


def reference_fused_moe(x: torch.Tensor, router_logits: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                        top_k: int, renormalize: bool) -> torch.Tensor:
    """The whole op: select_experts, then reference_fused_experts. [T, H] -> [T, H]."""
    topk_weights, topk_ids = select_experts(router_logits, top_k, renormalize)
    return reference_fused_experts(x, topk_weights, topk_ids, w13, w2)


def quantize_fp8_experts(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Stacked experts [E, N, K] -> (float8_e4m3fn [E, N, K], float32 scale [E, N]): quantize_fp8_weight's
    max|row| / 448 per output row of every expert."""
    q, scale = quantize_fp8_weight(w.reshape(-1, w.shape[-1]))
    return q.view(w.shape), scale.view(w.shape[:-1])


def dequantize_experts(w: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """fp8 experts [E, N, K] with scale [E, N] -> [E, N, K] in dtype (w * scale in float32, rounded once)."""
    return dequantize_per_channel(w.reshape(-1, w.shape[-1]), scale.reshape(-1)).view(w.shape).to(dtype)


def reference_fused_moe_fp8(x: torch.Tensor, router_logits: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor,
                            w2: torch.Tensor, w2_scale: torch.Tensor, top_k: int, renormalize: bool) -> torch.Tensor:
    """graphllm.fused_moe_fp8: reference_fused_moe over the experts dequantized to x's dtype. [T, H] -> [T, H]."""
    return reference_fused_moe(x, router_logits, dequantize_experts(w13, w13_scale, x.dtype),
                               dequantize_experts(w2, w2_scale, x.dtype), top_k, renormalize)
