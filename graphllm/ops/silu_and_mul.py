"""SwiGLU activation over a fused gate/up projection, as one registered custom op.

`torch.ops.graphllm.silu_and_mul(x)` is what `fuse_silu_mul` puts in place of
`silu(gate) * up` once `fuse_gate_up` has made gate and up two halves of one linear's output.
This file holds the PyTorch reference (used on CPU and as the oracle for the Triton kernel
that will live in `graphllm/kernels/`); the fake implementation lets tracing see one node.
"""

import torch
import torch.nn.functional as F


def reference_silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x: [..., 2I] -> [..., I]; the same ops as LlamaMLP, in x's dtype (bit-identical on CPU)."""
    size = x.shape[-1] // 2
    gate, up = x[..., :size], x[..., size:]  # [..., I] views, like split_with_sizes gives
    return F.silu(gate) * up


@torch.library.custom_op("graphllm::silu_and_mul", mutates_args=())
def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """silu(x[..., :I]) * x[..., I:] for x: [..., 2I]; returns a new contiguous [..., I] in x's dtype."""
    torch._check(x.shape[-1] % 2 == 0, lambda: f"silu_and_mul needs an even last dim, got {x.shape[-1]}")
    return reference_silu_and_mul(x).contiguous()  # contiguous: the fake promises it


@silu_and_mul.register_fake
def _(x):
    torch._check(x.shape[-1] % 2 == 0, lambda: f"silu_and_mul needs an even last dim, got {x.shape[-1]}")
    return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))
