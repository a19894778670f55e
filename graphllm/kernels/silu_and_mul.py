"""SwiGLU over a fused gate/up projection output, in one Triton kernel.

x: [M, 2I] (last dim contiguous, any row stride) holds gate = x[:, :I] and up = x[:, I:];
the output is a new contiguous [M, I] in x's dtype. Program (row, block) takes BLOCK columns of
one row (masked at the edge), so the grid is [M, cdiv(I, BLOCK)].

Rounding follows reference_silu_and_mul (F.silu(gate) * up in x's dtype) step by step:

    a   = silu(gate.float()).to(x.dtype)
    out = (a.float() * up.float()).to(x.dtype)

GELU_TANH: the same with Gemma's GeGLU, a = gelu(gate.float(), approximate="tanh").to(x.dtype).
INTERLEAVED: x's columns are gate 0, up 0, gate 1, up 1, ... (a product over skinny_matmul.interleave_gate_up's
weight, where linear_epilogue's ops take the rows the fused kernel does not): each program reads its columns'
pairs side by side.
"""

import torch
import triton
import triton.language as tl

from graphllm.kernels.gdc import dependent_start
from graphllm.kernels.launch import pdl_launch
from graphllm.kernels.reference import reference_silu_and_mul

BLOCK = 1024  # columns per program


def silu_and_mul_reference(x: torch.Tensor) -> torch.Tensor:
    """The PyTorch oracle: silu(x[:, :I]) * x[:, I:] in x's dtype, [M, 2I] -> [M, I]."""
    return reference_silu_and_mul(x)


@triton.jit
def gelu_tanh(x):
    """F.gelu(x, approximate="tanh") of float32 x: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), with
    tanh(u) = 1 - 2 / (exp(2u) + 1) (Triton has no tanh in every version, nor in the interpreter)."""
    u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    return 0.5 * x * (2.0 - 2.0 / (tl.exp(2.0 * u) + 1.0))


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, size, stride_xm, BLOCK: tl.constexpr, GELU_TANH: tl.constexpr,
                         PDL: tl.constexpr = False, INTERLEAVED: tl.constexpr = False):
    if PDL:  # launched as a programmatic dependent (launch.py): nothing is read before the kernels before are done
        dependent_start()
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < size
    x_row = x_ptr + row * stride_xm
    if INTERLEAVED:
        pairs = 2 * offs[:, None] + tl.arange(0, 2)[None, :]  # [BLOCK, 2]: (gate, up) of each column
        gate, up = tl.split(tl.load(x_row + pairs, mask=mask[:, None], other=0.0).to(tl.float32))
    else:
        gate = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)  # [BLOCK]
        up = tl.load(x_row + size + offs, mask=mask, other=0.0).to(tl.float32)
    if GELU_TANH:
        a = gelu_tanh(gate).to(x_ptr.dtype.element_ty).to(tl.float32)
    else:
        a = (gate / (1.0 + tl.exp(-gate))).to(x_ptr.dtype.element_ty).to(tl.float32)  # F.silu's cast back
    tl.store(out_ptr + row * size + offs, (a * up).to(out_ptr.dtype.element_ty), mask=mask)


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    """silu_and_mul with Gemma's GeGLU: gelu(x[:, :I], approximate="tanh") * x[:, I:]."""
    return silu_and_mul(x, gelu=True)


def silu_and_mul(x: torch.Tensor, gelu: bool = False, interleaved: bool = False) -> torch.Tensor:
    """silu(x[:, :I]) * x[:, I:] (gelu: gelu_tanh_and_mul's) for x: [M, 2I] with last-dim stride 1 (M may
    be 0); returns a new contiguous [M, I] in x's dtype. interleaved: gate x[:, 0::2], up x[:, 1::2]."""
    num_rows, width = x.shape
    assert width % 2 == 0 and x.stride(-1) == 1, f"silu_and_mul needs [M, 2I] rows of stride 1, got {x.shape}"
    size = width // 2
    out = x.new_empty((num_rows, size))
    if num_rows == 0 or size == 0:
        return out
    _silu_and_mul_kernel[(num_rows, triton.cdiv(size, BLOCK))](
        x, out, size, x.stride(0), BLOCK=BLOCK, GELU_TANH=gelu, INTERLEAVED=interleaved, num_warps=4,
        **pdl_launch(x.device))
    return out
