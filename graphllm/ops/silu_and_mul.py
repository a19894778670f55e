"""SwiGLU activation over a fused gate/up projection, as one registered custom op.

`torch.ops.graphllm.silu_and_mul(x)` is what `fuse_silu_mul` puts in place of
`silu(gate) * up` once `fuse_gate_up` has made gate and up two halves of one linear's output.
The PyTorch reference (graphllm/kernels/reference.py) runs on CPU and is the oracle of the Triton
kernel (graphllm/kernels/silu_and_mul.py); the fake implementation lets tracing see one node.
"""

import torch

from graphllm.kernels.reference import reference_silu_and_mul


@torch.library.custom_op("graphllm::silu_and_mul", mutates_args=())
def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """silu(x[..., :I]) * x[..., I:] for x: [..., 2I]; returns a new contiguous [..., I] in x's dtype."""
    torch._check(x.shape[-1] % 2 == 0, lambda: f"silu_and_mul needs an even last dim, got {x.shape[-1]}")
    return reference_silu_and_mul(x).contiguous()  # contiguous: the fake promises it


@silu_and_mul.register_fake
def _(x):
    torch._check(x.shape[-1] % 2 == 0, lambda: f"silu_and_mul needs an even last dim, got {x.shape[-1]}")
    return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))
