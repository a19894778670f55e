"""Rotary position embedding in transformers' rotate-half form, shared by the models (eager),
the fuse_rope_attention pass (the pattern it matches) and the attention backends (the reference
of their fused rotary + KV-write kernels)."""

import torch


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, H, D]; cos, sin: [T, D]."""
    return x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]
