"""Rotary position embedding in transformers' rotate-half form, shared by the models (eager),
the fuse_rope_attention pass (the pattern it matches) and the attention backends (the reference
of their fused rotary + KV-write kernels), and the per-head RMSNorm that some models run before it."""

from typing import NamedTuple

import torch


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, H, D]; cos, sin: [T, D]."""
    return x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]


class HeadNorms(NamedTuple):
    """RMSNorm of every q and k head over its D dims before the rotary: weights [D] in q's dtype, scaled by
    weight or with unit_offset by 1 + weight (Gemma's)."""
    q_weight: torch.Tensor
    k_weight: torch.Tensor
    eps: float
    unit_offset: bool = False


def normed_heads(q: torch.Tensor, k: torch.Tensor, norms: HeadNorms | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, k) RMS-normed per head by norms ([T, H, D] each, new contiguous tensors), or as they are for None:
    graphllm's row kernel on CUDA, else reference_rms_norm."""
    if norms is None:
        return q, k
    from graphllm.kernels.reference import reference_rms_norm
    from graphllm.kernels.rms_norm import rms_norm

    def norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if not x.is_cuda:
            return reference_rms_norm(x, weight, norms.eps, norms.unit_offset).contiguous()
        return rms_norm(x.reshape(-1, x.shape[-1]), weight, norms.eps, unit_offset=norms.unit_offset)[0].view(x.shape)

    return norm(q, norms.q_weight), norm(k, norms.k_weight)
