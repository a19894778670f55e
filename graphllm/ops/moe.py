"""A mixture-of-experts feed-forward (router softmax, top-k, SwiGLU experts, weighted sum) as one registered
custom op:

    torch.ops.graphllm.fused_moe(x [T, H], router_logits [T, E], w13 [E, 2I, H], w2 [E, H, I],
                                 top_k: int, renormalize: bool) -> [T, H]

vLLM's fused_moe semantics (graphllm/kernels/fused_moe_reference.py): softmax of the router logits in
float32, the top_k experts per token, their weights renormalised to sum to 1 when `renormalize` (Mixtral;
Qwen3-MoE's norm_topk_prob), then each chosen expert's down(silu(gate(x)) * up(x)) weighted and summed.
w13 stacks each expert's gate rows then its up rows. The result is a new contiguous tensor in x's dtype.

The model's sparse block calls it (graphllm/models/moe.py), so the captured graph holds one node per MoE
layer, whatever the routing: the op is opaque to tracing and nothing in it is data-dependent from the
graph's side. On CUDA it runs the Triton kernels (graphllm/kernels/fused_moe.py: routing, then the experts'
grouped GEMMs with SiLU·mul and the k-sum fused in; three launches at decode sizes, CUDA-graph safe);
elsewhere the PyTorch reference (one pass over the chosen experts). Inductor calls it as an extern op; it
has no decomposition.
"""

import torch

from graphllm.kernels.fused_moe_reference import reference_fused_experts, select_experts


def _check_shapes(x, router_logits, w13, w2, top_k) -> None:
    num_experts, two_size, hidden = w13.shape
    torch._check(x.dim() == 2 and x.shape[1] == hidden, lambda: f"fused_moe: x {tuple(x.shape)} vs w13 "
                                                                f"{tuple(w13.shape)}")
    torch._check(router_logits.dim() == 2 and router_logits.shape[1] == num_experts,
                 lambda: f"fused_moe: router_logits {tuple(router_logits.shape)} for {num_experts} experts")
    torch._check(tuple(w2.shape) == (num_experts, hidden, two_size // 2),
                 lambda: f"fused_moe: w2 {tuple(w2.shape)} does not pair with w13 {tuple(w13.shape)}")
    torch._check(0 < top_k <= num_experts, lambda: f"fused_moe: top_k {top_k} of {num_experts} experts")


@torch.library.custom_op("graphllm::fused_moe", mutates_args=())
def fused_moe(x: torch.Tensor, router_logits: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
              top_k: int, renormalize: bool) -> torch.Tensor:
    """x [T, H], router_logits [T, E], w13 [E, 2I, H], w2 [E, H, I] -> [T, H] in x's dtype."""
    _check_shapes(x, router_logits, w13, w2, top_k)
    if x.is_cuda:
        from graphllm.kernels.fused_moe import fused_moe as triton_fused_moe
        return triton_fused_moe(x, router_logits, w13, w2, top_k, renormalize)
    topk_weights, topk_ids = select_experts(router_logits, top_k, renormalize)  # [T, k] float32, int64
    return reference_fused_experts(x, topk_weights, topk_ids, w13, w2)


@fused_moe.register_fake
def _(x, router_logits, w13, w2, top_k, renormalize):
    _check_shapes(x, router_logits, w13, w2, top_k)
    return x.new_empty(x.shape)
