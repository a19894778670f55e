"""SwiGLU, then its row quantized to float8 for the next W8A8 linear: one Triton kernel.

x: [M, 2I] (last dim contiguous, any row stride) holds gate = x[:, :I] and up = x[:, I:]. Per row:

    y     = silu_and_mul(x) in x's dtype            (graphllm/kernels/silu_and_mul.py's rounding)
    scale = max(max|y| / 448, 1e-12)                 (float32, correctly rounded)
    yq    = clamp(y / scale, +-448) as float8_e4m3fn (quant_layout.quantize_fp8_rows)

One program per row. A row of up to MAX_BLOCK columns (ONE_PASS) is read once and y held in registers for the
quantization; a wider one is walked twice in BLOCK columns, once for max|y| and once to quantize and store (the
second read from L2). Inductor, given silu_and_mul and the quantization as one graph, made
three kernels of it at decode sizes (a split reduction, its combine, the quantizing pass: 60 us per
decode step of the 8B shape on the H200), so quantize_fp8_activations puts this kernel there instead.
"""

import torch
import triton
import triton.language as tl

from graphllm.kernels.fp8_matmul import _quantize
from graphllm.kernels.gdc import dependent_start
from graphllm.kernels.launch import pdl_launch
from graphllm.kernels.quant_layout import FP8_DTYPE, quantize_fp8_rows
from graphllm.kernels.reference import reference_silu_and_mul

MAX_BLOCK = 16384  # columns per pass of a row: 14336 (Llama-3-8B) in one


def silu_and_mul_fp8_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(float8 [M, I], float32 scale [M, 1]): the two ops it fuses, as the graph had them."""
    return quantize_fp8_rows(reference_silu_and_mul(x))


@triton.jit
def _silu_mul(x_row, offs, mask, size):
    """silu(gate) * up for columns offs of one row, rounded as the eager ops round, as float32."""
    gate = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_row + size + offs, mask=mask, other=0.0).to(tl.float32)
    act = (gate / (1.0 + tl.exp(-gate))).to(x_row.dtype.element_ty).to(tl.float32)
    return (act * up).to(x_row.dtype.element_ty).to(tl.float32)


@triton.jit
def _silu_and_mul_fp8_kernel(x_ptr, out_ptr, scale_ptr, size, stride_xm, BLOCK: tl.constexpr,
                             ONE_PASS: tl.constexpr = False, PDL: tl.constexpr = False):
    if PDL:  # launched as a programmatic dependent (launch.py): nothing is read before the kernels before are done
        dependent_start()
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_xm
    if ONE_PASS:  # the row fits one block: SwiGLU once, held in registers for the quantization
        offs = tl.arange(0, BLOCK)
        mask = offs < size
        y = _silu_mul(x_row, offs, mask, size)
        scale = tl.maximum(tl.math.div_rn(tl.max(tl.abs(y), 0), 448.0), 1e-12)
        tl.store(scale_ptr + row, scale)
        tl.store(out_ptr + row * size + offs, _quantize(y, scale, tl.math.div_rn(1.0, scale)), mask=mask)
    else:
        amax = tl.zeros([BLOCK], dtype=tl.float32)
        for c0 in range(0, size, BLOCK):
            offs = c0 + tl.arange(0, BLOCK)
            amax = tl.maximum(amax, tl.abs(_silu_mul(x_row, offs, offs < size, size)))
        scale = tl.maximum(tl.math.div_rn(tl.max(amax, 0), 448.0), 1e-12)
        inv = tl.math.div_rn(1.0, scale)
        tl.store(scale_ptr + row, scale)
        for c0 in range(0, size, BLOCK):
            offs = c0 + tl.arange(0, BLOCK)
            mask = offs < size
            tl.store(out_ptr + row * size + offs, _quantize(_silu_mul(x_row, offs, mask, size), scale, inv),
                     mask=mask)


def silu_and_mul_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """silu_and_mul_fp8_reference for x: [M, 2I] with last-dim stride 1 (M may be 0): a new contiguous
    float8 [M, I] and float32 scales [M]."""
    num_rows, width = x.shape
    assert width % 2 == 0 and x.stride(-1) == 1, f"silu_and_mul_fp8 needs [M, 2I] rows of stride 1, got {x.shape}"
    size = width // 2
    out = torch.empty((num_rows, size), dtype=FP8_DTYPE, device=x.device)
    scale = torch.empty((num_rows,), dtype=torch.float32, device=x.device)
    if num_rows and size:
        block = min(MAX_BLOCK, triton.next_power_of_2(size))
        _silu_and_mul_fp8_kernel[(num_rows,)](x, out, scale, size, x.stride(0), BLOCK=block, ONE_PASS=size <= block,
                                              num_warps=16 if block >= 8192 else 4, **pdl_launch(x.device))
    return out, scale
