"""RMSNorm of each row, optionally after the residual add, in one Triton kernel.

x: [M, D] (last dim contiguous, any row stride), weight: [D], residual: None or [M, D] in x's
dtype. One program per row holds the whole row as a masked [BLOCK_D] tile (BLOCK_D = the next
power of two of D), so the sum of squares is one tl.sum and each element is read once.

Rounding follows reference_rms_norm (graphllm/kernels/reference.py) step by step, so half-precision results differ from the
reference only by float32 summation order and rsqrt:

    h      = (x.float() + residual.float()).to(x.dtype)    # torch's add; h = x without residual
    normed = (h.float() * rsqrt(mean(h.float()^2) + eps)).to(x.dtype)
    out    = (weight.float() * normed.float()).to(promote_types(weight.dtype, x.dtype))

or with unit_offset (Gemma's norm) out = (h.float() * rsqrt(...) * (1 + weight.float())).to(x.dtype), no cast
between. With a residual, h is written too (a new contiguous [M, D], the next layer's residual).
"""

import torch
import triton
import triton.language as tl

from graphllm.kernels.gdc import dependent_start
from graphllm.kernels.launch import pdl_launch
from graphllm.kernels.reference import reference_rms_norm


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
                       unit_offset: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The PyTorch oracle: the ops reference after `x + residual`. Returns (out, h or None)."""
    if residual is None:
        return reference_rms_norm(x, weight, eps, unit_offset), None
    h = (x + residual).contiguous()  # [M, D] in x's dtype
    return reference_rms_norm(h, weight, eps, unit_offset), h


@triton.jit
def _rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, h_ptr, D, eps,
                     stride_xm, stride_rm,  # out and h are contiguous: row stride D
                     HAS_RESIDUAL: tl.constexpr, UNIT_OFFSET: tl.constexpr, BLOCK_D: tl.constexpr,
                     PDL: tl.constexpr = False):
    if PDL:  # launched as a programmatic dependent (launch.py): nothing is read before the kernels before are done
        dependent_start()
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_D)
    mask = offs < D
    h = tl.load(x_ptr + row * stride_xm + offs, mask=mask, other=0.0)  # [BLOCK_D] in x's dtype
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_rm + offs, mask=mask, other=0.0)
        h = (h.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)  # round once, like torch
        tl.store(h_ptr + row * D + offs, h, mask=mask)
    hf = h.to(tl.float32)  # masked lanes are 0: they add nothing to the sum
    rstd = tl.rsqrt(tl.sum(hf * hf, axis=0) / D + eps)
    if UNIT_OFFSET:  # Gemma: scaled by 1 + weight in float32, one cast at the end
        w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        out = hf * rstd * (1.0 + w)
    else:
        normed = (hf * rstd).to(x_ptr.dtype.element_ty).to(tl.float32)  # the reference's cast back
        w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        out = w * normed
    tl.store(out_ptr + row * D + offs, out.to(out_ptr.dtype.element_ty), mask=mask)


def _num_warps(block_d: int) -> int:
    return 4 if block_d <= 1024 else 8 if block_d <= 4096 else 16


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
             unit_offset: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """RMSNorm of x ([M, D], last-dim stride 1) or of h = x + residual, scaled by weight ([D]) or, with
    unit_offset, by 1 + weight in float32 (Gemma's).

    Returns (out, h): out a new contiguous [M, D] in promote_types(weight.dtype, x.dtype) (x's dtype with
    unit_offset); h a new
    contiguous [M, D] in x's dtype when residual ([M, D], x's dtype, last-dim stride 1) is given,
    else None. M may be 0. The row count only sizes the grid, so it never causes a recompile.
    """
    num_rows, dim = x.shape
    assert weight.shape == (dim,) and x.stride(-1) == 1
    weight = weight.contiguous()
    out = x.new_empty((num_rows, dim), dtype=x.dtype if unit_offset else torch.promote_types(weight.dtype, x.dtype))
    h = None
    if residual is not None:
        assert residual.shape == x.shape and residual.dtype == x.dtype and residual.stride(-1) == 1
        h = torch.empty_like(x, memory_format=torch.contiguous_format)
    if num_rows == 0:
        return out, h
    block_d = triton.next_power_of_2(dim)
    # Row strides stay specialised: they are fixed per model, and a multiple of 16 lets loads vectorise.
    _rms_norm_kernel[(num_rows,)](
        x, x if residual is None else residual, weight, out, out if h is None else h, dim, eps,
        x.stride(0), 0 if residual is None else residual.stride(0),
        HAS_RESIDUAL=residual is not None, UNIT_OFFSET=unit_offset, BLOCK_D=block_d, num_warps=_num_warps(block_d),
        **pdl_launch(x.device))
    return out, h
