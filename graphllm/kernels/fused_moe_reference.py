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
"""

import torch
import torch.nn.functional as F


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
