"""fp8_prologue_matmul: one launch of the fp8 kernel with a norm or activation prologue computes what the fp8 kernel
computes on that prologue's output (the same row scale, float8 operand and sums: equal bit for bit), the
prologue's output is the eager ops' (skinny_matmul's _operand, within their rounding), and add_rms_norm's new
residual is x + residual exactly. Every prologue, dynamic and static scales, one and three rows, the one-row
multiply-add and the 16-row tile with K splits.

The prologue output is materialized by a small kernel over the same helpers, so that the comparison does not
depend on Triton's CPU interpreter casting float32 to float8 correctly (it does not, where rounding carries into
the exponent: test_fp8_matmul.py's docstring): both sides cast the same values."""

import pytest
import torch

pytest.importorskip("triton")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from graphllm.kernels.fp8_matmul import fp8_matmul, fp8_prologue_matmul  # noqa: E402
from graphllm.kernels.quant_layout import quantize_fp8_weight  # noqa: E402
from graphllm.kernels.reference import (  # noqa: E402
    reference_gelu_tanh_and_mul, reference_rms_norm, reference_silu_and_mul)
from graphllm.kernels.skinny_matmul import PROLOGUES, _operand, _row_rstd  # noqa: E402
from tests.kernels.conftest import DEVICE, LOW_DTYPE, assert_close, randn  # noqa: E402


@triton.jit
def _materialize_kernel(x_ptr, res_ptr, norm_w_ptr, out_ptr, M, K, eps, stride_xm, stride_rm,
                        BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, PROLOGUE: tl.constexpr,
                        UNIT_OFFSET: tl.constexpr):
    offs_m = tl.arange(0, BLOCK_M)
    m_mask = offs_m < M
    rstd = tl.zeros([BLOCK_M, 1], dtype=tl.float32)
    if PROLOGUE == 1 or PROLOGUE == 2:
        rstd = _row_rstd(x_ptr, res_ptr, offs_m, m_mask, K, eps, stride_xm, stride_rm, BLOCK_M, BLOCK_K, PROLOGUE)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        mask = m_mask[:, None] & (k < K)[None, :]
        a = _operand(x_ptr, res_ptr, norm_w_ptr, x_ptr, rstd, offs_m, k, mask, K, stride_xm, stride_rm, 0,
                     PROLOGUE, UNIT_OFFSET)
        tl.store(out_ptr + offs_m[:, None] * K + k[None, :], a, mask=mask)


def materialize(prologue, x, residual, norm_w, eps, unit_offset, k, block_k):
    """The prologue's output [M, K] as the fused kernel computes it (rstd summed in block_k steps)."""
    out = x.new_empty((x.shape[0], k))
    _materialize_kernel[(1,)](x, x if residual is None else residual, x if norm_w is None else norm_w, out,
                              x.shape[0], k, eps, x.stride(0), 0 if residual is None else residual.stride(0),
                              BLOCK_M=16, BLOCK_K=block_k, PROLOGUE=PROLOGUES[prologue], UNIT_OFFSET=unit_offset)
    return out


def reference_operand(prologue, x, residual, norm_w, eps, unit_offset):
    if prologue == "silu_mul":
        return reference_silu_and_mul(x)
    if prologue == "gelu_mul":
        return reference_gelu_tanh_and_mul(x)
    return reference_rms_norm(x if residual is None else x + residual, norm_w, eps, unit_offset)


CONFIGS = [
    {"BLOCK_M": 1, "BLOCK_N": 32, "BLOCK_K": 64, "SPLIT_K": 3, "num_warps": 4, "num_stages": 2},
    {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 64, "SWAP_AB": True, "SPLIT_K": 2, "num_warps": 4, "num_stages": 2},
]


@pytest.mark.parametrize("prologue, unit_offset", [("rms_norm", False), ("add_rms_norm", False),
                                                   ("add_rms_norm", True), ("silu_mul", False),
                                                   ("gelu_mul", False)])
@pytest.mark.parametrize("static", (False, True))
@pytest.mark.parametrize("m, config", [(1, CONFIGS[0]), (1, CONFIGS[1]), (3, CONFIGS[1])])
def test_fused_prologue_is_the_fp8_kernel_on_the_prologue_output(prologue, unit_offset, static, m, config):
    n, k, eps, dtype = 64, 192, 1e-5, LOW_DTYPE
    act = prologue in ("silu_mul", "gelu_mul")
    x = randn((m, 2 * k if act else k), dtype, 1)
    residual = randn((m, k), dtype, 2) if prologue == "add_rms_norm" else None
    norm_w = None if act else (randn((k,), dtype, 3) / 4 + (0 if unit_offset else 1))
    weight, weight_scale = quantize_fp8_weight(randn((n, k), torch.float32, 4) / k ** 0.5)
    bias = randn((n,), dtype, 5)
    input_scale = torch.tensor([0.02], device=DEVICE) if static else None

    got, h = fp8_prologue_matmul(prologue, x, weight, weight_scale, input_scale, bias, residual, norm_w, eps,
                                 unit_offset, config)
    operand = materialize(prologue, x, residual, norm_w, eps, unit_offset, k, config["BLOCK_K"])
    assert_close(operand, reference_operand(prologue, x, residual, norm_w, eps, unit_offset))
    want = fp8_matmul(operand, weight, weight_scale, input_scale, bias, dict(config, FUSE_QUANT=True))
    assert torch.equal(got, want)
    if prologue == "add_rms_norm":
        assert torch.equal(h, x + residual)
    else:
        assert h is None


def test_wrong_operand_widths_are_refused():
    weight, weight_scale = quantize_fp8_weight(randn((64, 128), torch.float32, 0))
    x = randn((1, 128), LOW_DTYPE, 1)
    with pytest.raises(AssertionError):
        fp8_prologue_matmul("silu_mul", x, weight, weight_scale)  # an activation takes [M, 2K]
    with pytest.raises(AssertionError):
        fp8_prologue_matmul("add_rms_norm", x, weight, weight_scale, norm_weight=x[0], eps=1e-5)  # no residual
