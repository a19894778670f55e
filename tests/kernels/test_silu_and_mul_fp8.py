"""silu_and_mul_fp8 (SwiGLU then per-row float8 quantization, one kernel) equals the two ops it replaces.

On the GPU: random rows, bit for bit against graphllm's silu_and_mul kernel (the same SiLU arithmetic)
followed by the reference quantization, and within one float8 step of the PyTorch reference. Under
Triton's CPU interpreter (whose float32 -> float8 cast is wrong where rounding carries into the exponent,
see test_fp8_matmul) the rows are built so that the product and its quantization are exact: gate = 32
(SiLU(32) rounds to 32), up = float8 values times 2^-11 with a 448 in each row, so the scale is 2^-6."""

import pytest
import torch

pytest.importorskip("triton")

from graphllm.kernels.quant_layout import FP8_DTYPE, quantize_fp8_rows  # noqa: E402
from graphllm.kernels.silu_and_mul import silu_and_mul  # noqa: E402
from graphllm.kernels import silu_and_mul_fp8 as silu_and_mul_fp8_module  # noqa: E402
from graphllm.kernels.silu_and_mul_fp8 import silu_and_mul_fp8, silu_and_mul_fp8_reference  # noqa: E402
from tests.kernels.conftest import DEVICE, LOW_DTYPE, ON_GPU, randn  # noqa: E402


def exact_rows(m: int, size: int, seed: int) -> torch.Tensor:
    v = randn((m, size), torch.float32, seed).mul(60).clamp(-448, 448).to(FP8_DTYPE).float()
    v[:, seed % size] = 448.0
    gate = torch.full((m, size), 32.0, device=v.device)
    return torch.cat([gate, v * 2.0 ** -11], dim=1).to(LOW_DTYPE)


@pytest.mark.parametrize("max_block", [16384, 128])  # one pass over each row; and two over 128-column blocks
@pytest.mark.parametrize("m, size", [(1, 64), (3, 200), (2, 1000)])
def test_matches_the_two_ops(m, size, max_block, monkeypatch):
    monkeypatch.setattr(silu_and_mul_fp8_module, "MAX_BLOCK", max_block)
    x = randn((m, 2 * size), LOW_DTYPE, m) * 3 if ON_GPU else exact_rows(m, size, m)
    xq, scale = silu_and_mul_fp8(x)
    assert xq.shape == (m, size) and xq.dtype == FP8_DTYPE and scale.shape == (m,)
    want_q, want_scale = silu_and_mul_fp8_reference(x)
    if ON_GPU:  # the kernel's SiLU is graphllm's silu_and_mul's; quantizing that is exact
        same_q, same_scale = quantize_fp8_rows(silu_and_mul(x))
        assert torch.equal(scale, same_scale.reshape(-1)) and torch.equal(xq.view(torch.uint8), same_q.view(torch.uint8))
        step = want_q.float().abs() * 2.0 ** -3 + 2.0 ** -9  # one float8 e4m3 step at that magnitude
        assert torch.all((xq.float() - want_q.float()).abs() <= step)
    else:
        assert torch.equal(scale, want_scale.reshape(-1)) and torch.equal(xq.float(), want_q.float())


def test_zero_rows_and_strided_input():
    assert silu_and_mul_fp8(torch.empty((0, 64), dtype=LOW_DTYPE, device=DEVICE))[0].shape == (0, 32)
    x = exact_rows(2, 48, 5)
    wide = torch.zeros((2, 128), dtype=LOW_DTYPE, device=DEVICE)
    wide[:, :96] = x
    xq, scale = silu_and_mul_fp8(wide[:, :96])
    want_q, want_scale = silu_and_mul_fp8(x)
    assert torch.equal(xq.float(), want_q.float()) and torch.equal(scale, want_scale)
