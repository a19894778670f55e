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

Its float8 twin, what QuantizeFP8Experts puts in its place with --quantization fp8
(graphllm/passes/quantization/quantize_fp8_experts.py):

    torch.ops.graphllm.fused_moe_fp8(x [T, H], router_logits [T, E], w13 f8e4m3fn [E, 2I, H], w13_scale f32 [E, 2I],
                                     w2 f8e4m3fn [E, H, I], w2_scale f32 [E, H], top_k, renormalize) -> [T, H]

computes fused_moe over the dequantized experts, W[e, n, :] = w[e, n, :] * scale[e, n] (quant_layout's per-channel
fp8 layout, per expert). Weight-only: x stays in its dtype. On CUDA the same Triton kernels read the float8 tiles
and scale each output column's sum; elsewhere the experts are dequantized to x's dtype and the reference runs.
A separate op, not optional scales on fused_moe: each schema says what its weights are (the fake checks the
dtypes), fused_moe's graphs and artifacts stay as they were, and passes that match one (shard_tp, the compiler's
count of float expert bytes) do not take the other for it.

What the fuse_moe_router pass puts in place of the router's graphllm.linear and the fused_moe reading it
(graphllm/passes/lowering/fuse_moe_router.py):

    torch.ops.graphllm.fused_moe_routed(x [T, H], w_router [E, H], w13, w2, top_k, renormalize) -> [T, H]
        = fused_moe(x, linear(x, w_router), w13, w2, top_k, renormalize)

so that one token's routing is one launch on CUDA (graphllm/kernels/moe_router.py: the linear and the choice);
other steps run the router's graphllm.linear and then fused_moe's kernels, as without the pass.
"""

import torch
import torch.nn.functional as F

from graphllm.kernels.fused_moe_reference import (reference_fused_experts, reference_fused_moe_fp8,
                                                  select_experts)
from graphllm.kernels.quant_layout import FP8_DTYPE


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


def _check_fp8_experts(w13, w13_scale, w2, w2_scale) -> None:
    torch._check(w13.dtype == FP8_DTYPE and w2.dtype == FP8_DTYPE,
                 lambda: f"fused_moe_fp8: experts {w13.dtype}, {w2.dtype}; float8_e4m3fn expected")
    for name, w, scale in (("w13", w13, w13_scale), ("w2", w2, w2_scale)):
        torch._check(scale.dtype == torch.float32 and tuple(scale.shape) == tuple(w.shape[:2]),
                     lambda: f"fused_moe_fp8: {name}_scale {scale.dtype} {tuple(scale.shape)}; float32 "
                             f"{tuple(w.shape[:2])} expected (one per output row of each expert)")


@torch.library.custom_op("graphllm::fused_moe_fp8", mutates_args=())
def fused_moe_fp8(x: torch.Tensor, router_logits: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor,
                  w2: torch.Tensor, w2_scale: torch.Tensor, top_k: int, renormalize: bool) -> torch.Tensor:
    """x [T, H], router_logits [T, E], w13 float8 [E, 2I, H], w13_scale f32 [E, 2I], w2 float8 [E, H, I],
    w2_scale f32 [E, H] -> [T, H] in x's dtype."""
    _check_shapes(x, router_logits, w13, w2, top_k)
    _check_fp8_experts(w13, w13_scale, w2, w2_scale)
    if x.is_cuda:
        from graphllm.kernels.fused_moe import fused_moe as triton_fused_moe
        return triton_fused_moe(x, router_logits, w13, w2, top_k, renormalize, w13_scale=w13_scale,
                                w2_scale=w2_scale)
    return reference_fused_moe_fp8(x, router_logits, w13, w13_scale, w2, w2_scale, top_k, renormalize)


@fused_moe_fp8.register_fake
def _(x, router_logits, w13, w13_scale, w2, w2_scale, top_k, renormalize):
    _check_shapes(x, router_logits, w13, w2, top_k)
    _check_fp8_experts(w13, w13_scale, w2, w2_scale)
    return x.new_empty(x.shape)


def _check_router(x, w_router, w13) -> None:
    torch._check(w_router.dim() == 2 and tuple(w_router.shape) == (w13.shape[0], x.shape[-1]),
                 lambda: f"fused_moe_routed: w_router {tuple(w_router.shape)} for {w13.shape[0]} experts of x "
                         f"{tuple(x.shape)}")


@torch.library.custom_op("graphllm::fused_moe_routed", mutates_args=())
def fused_moe_routed(x: torch.Tensor, w_router: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, top_k: int,
                     renormalize: bool) -> torch.Tensor:
    """x [T, H], w_router [E, H], w13 [E, 2I, H], w2 [E, H, I] -> [T, H] in x's dtype: fused_moe over the router's
    logits x @ w_router^T."""
    _check_router(x, w_router, w13)
    if not x.is_cuda:
        return fused_moe(x, F.linear(x, w_router), w13, w2, top_k, renormalize)
    from graphllm.kernels.fused_moe import fused_experts
    from graphllm.kernels.moe_router import router_topk, router_topk_takes
    if router_topk_takes(x, w_router):
        return fused_experts(x, *router_topk(x, w_router, top_k, renormalize), w13, w2)
    from graphllm.ops.linear import linear
    return fused_moe(x, linear(x, w_router), w13, w2, top_k, renormalize)


@fused_moe_routed.register_fake
def _(x, w_router, w13, w2, top_k, renormalize):
    _check_router(x, w_router, w13)
    _check_shapes(x, x.new_empty((x.shape[0], w13.shape[0])), w13, w2, top_k)
    return x.new_empty(x.shape)
