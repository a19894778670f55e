"""RMSNorm, alone or after the residual add, as registered custom ops.

`torch.ops.graphllm.rms_norm(x, weight, eps)` and
`torch.ops.graphllm.add_rms_norm(x, residual, weight, eps) -> (out, new_residual)` are what
`fuse_add_rmsnorm` puts in place of each RMSNorm module of the captured graph. Both are
functional (no input is written). Their reference (graphllm/kernels/reference.py) repeats
RMSNorm.forward op by op (normalise in float32, cast back to the input dtype, then scale), so on
CPU the fused graph is bit-identical to the unfused one; it is also the oracle of the row kernel.
"""

import torch

from graphllm.kernels.reference import reference_rms_norm


@torch.library.custom_op("graphllm::rms_norm", mutates_args=())
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of x ([..., D]) over its last dim, scaled by weight ([D]); a new contiguous tensor."""
    return reference_rms_norm(x, weight, eps).contiguous()  # contiguous: the fake promises it


@rms_norm.register_fake
def _(x, weight, eps):
    return x.new_empty(x.shape, dtype=torch.promote_types(weight.dtype, x.dtype))


@torch.library.custom_op("graphllm::add_rms_norm", mutates_args=())
def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """new_residual = x + residual (same shapes); returns (rms_norm(new_residual), new_residual)."""
    new_residual = (x + residual).contiguous()  # [..., D] in x's dtype
    return reference_rms_norm(new_residual, weight, eps).contiguous(), new_residual


@add_rms_norm.register_fake
def _(x, residual, weight, eps):
    dtype = torch.promote_types(x.dtype, residual.dtype)
    out = x.new_empty(x.shape, dtype=torch.promote_types(weight.dtype, dtype))
    return out, x.new_empty(x.shape, dtype=dtype)
