"""The linear layers of a step as one registered custom op, so decode batches can use skinny_matmul.

`torch.ops.graphllm.linear(x, weight, bias)` is what the `skinny_linear` pass puts in place of
`aten.linear` in graphs compiled for the GPU. It is opaque to Inductor, like the matmuls Inductor
hands to cuBLAS anyway, and decides per call, from shapes, which kernel runs:

- x on CUDA in float16/bfloat16, with a row count and weight shape where the kernel measured
  faster than cuBLAS (`beats_cublas`: one row against the attention projections, up to 16 rows
  against the vocabulary): graphllm/kernels/skinny_matmul.py, no split-K reduce kernel;
- anything else (prefill, large batches, the MLP, float32, CPU): F.linear, what aten.linear does.

Inside a CUDA graph the choice is made once, at capture. GRAPHLLM_SKINNY_MATMUL=0 in the
environment turns the kernel off (every call takes F.linear), for side-by-side benchmarks.
"""

import os

import torch
import torch.nn.functional as F

HALF_DTYPES = (torch.float16, torch.bfloat16)
KERNEL_ENABLED = os.environ.get("GRAPHLLM_SKINNY_MATMUL", "1") != "0"


def takes_kernel(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    if not (KERNEL_ENABLED and x.is_cuda and x.dtype in HALF_DTYPES and weight.dtype == x.dtype
            and weight.is_contiguous() and x.shape[-1] % 8 == 0 and (bias is None or bias.dtype == x.dtype)):
        return False
    from graphllm.kernels.skinny_matmul import beats_cublas
    rows = x.numel() // x.shape[-1]
    return rows > 0 and beats_cublas(rows, *weight.shape)


@torch.library.custom_op("graphllm::linear", mutates_args=())
def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x: [..., K], weight: [N, K], bias: [N] or None -> a new [..., N] in x's dtype (= F.linear)."""
    if takes_kernel(x, weight, bias):
        from graphllm.kernels.skinny_matmul import skinny_matmul
        rows = x.reshape(-1, x.shape[-1])
        if rows.stride(-1) != 1:
            rows = rows.contiguous()
        return skinny_matmul(rows, weight, bias).view(*x.shape[:-1], weight.shape[0])
    return F.linear(x, weight, bias)


@linear.register_fake
def _(x, weight, bias=None):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))
