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


def norm_dtype(x_dtype: torch.dtype, weight_dtype: torch.dtype, unit_offset: bool) -> torch.dtype:
    """The normed output's dtype: RMSNorm's promote(weight, x); Gemma's (unit_offset) x's."""
    return x_dtype if unit_offset else torch.promote_types(weight_dtype, x_dtype)


@torch.library.custom_op("graphllm::rms_norm", mutates_args=())
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, unit_offset: bool = False) -> torch.Tensor:
    """RMSNorm of x ([..., D]) over its last dim, scaled by weight ([D]), or with unit_offset by 1 + weight in
    float32 (Gemma's); a new contiguous tensor."""
    return reference_rms_norm(x, weight, eps, unit_offset).contiguous()  # contiguous: the fake promises it


@rms_norm.register_fake
def _(x, weight, eps, unit_offset=False):
    return x.new_empty(x.shape, dtype=norm_dtype(x.dtype, weight.dtype, unit_offset))


@torch.library.custom_op("graphllm::add_rms_norm", mutates_args=())
def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float, unit_offset: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """new_residual = x + residual (same shapes); returns (rms_norm(new_residual), new_residual)."""
    new_residual = (x + residual).contiguous()  # [..., D] in x's dtype
    return reference_rms_norm(new_residual, weight, eps, unit_offset).contiguous(), new_residual


@add_rms_norm.register_fake
def _(x, residual, weight, eps, unit_offset=False):
    dtype = torch.promote_types(x.dtype, residual.dtype)
    out = x.new_empty(x.shape, dtype=norm_dtype(dtype, weight.dtype, unit_offset))
    return out, x.new_empty(x.shape, dtype=dtype)
