"""SwiGLU (and Gemma's GeGLU) over a fused gate/up projection, as registered custom ops.

`torch.ops.graphllm.silu_and_mul(x)` is what `fuse_silu_mul` puts in place of
`silu(gate) * up` once `fuse_gate_up` has made gate and up two halves of one linear's output;
`torch.ops.graphllm.gelu_tanh_and_mul(x)` the same for `gelu(gate, approximate="tanh") * up`.
The PyTorch reference (graphllm/kernels/reference.py) runs on CPU and is the oracle of the Triton
kernel (graphllm/kernels/silu_and_mul.py); the fake implementation lets tracing see one node.
"""

import torch

from graphllm.kernels.reference import reference_gelu_tanh_and_mul, reference_silu_and_mul


@torch.library.custom_op("graphllm::silu_and_mul", mutates_args=())
def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """silu(x[..., :I]) * x[..., I:] for x: [..., 2I]; returns a new contiguous [..., I] in x's dtype."""
    torch._check(x.shape[-1] % 2 == 0, lambda: f"silu_and_mul needs an even last dim, got {x.shape[-1]}")
    return reference_silu_and_mul(x).contiguous()  # contiguous: the fake promises it


@silu_and_mul.register_fake
def _(x):
    torch._check(x.shape[-1] % 2 == 0, lambda: f"silu_and_mul needs an even last dim, got {x.shape[-1]}")
    return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))


@torch.library.custom_op("graphllm::gelu_tanh_and_mul", mutates_args=())
def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    """gelu(x[..., :I], approximate="tanh") * x[..., I:] for x: [..., 2I]; a new contiguous [..., I]."""
    torch._check(x.shape[-1] % 2 == 0, lambda: f"gelu_tanh_and_mul needs an even last dim, got {x.shape[-1]}")
    return reference_gelu_tanh_and_mul(x).contiguous()


@gelu_tanh_and_mul.register_fake
def _(x):
    torch._check(x.shape[-1] % 2 == 0, lambda: f"gelu_tanh_and_mul needs an even last dim, got {x.shape[-1]}")
    return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))
