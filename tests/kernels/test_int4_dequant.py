"""int4_dequantize writes exactly quant_layout's dequantization (rounded once to the dtype), and
int4_dequant_matmul (the large-M path: dense weight + cuBLAS) computes int4_linear_reference within
the rounding of the weight to that dtype."""

import pytest
import torch

pytest.importorskip("triton")

from graphllm.kernels.int4_dequant import int4_dequant_matmul, int4_dequantize  # noqa: E402
from graphllm.kernels.quant_layout import dequantize_int4, int4_linear_reference, quantize_int4_weight  # noqa: E402
from tests.kernels.conftest import DEVICE, LOW_DTYPE, randn  # noqa: E402
from tests.kernels.test_int8_matmul import UNIT, assert_within_rounding  # noqa: E402


@pytest.mark.parametrize("n,k,group", [(96, 256, 32), (64, 128, 128), (200, 64, 64)])
@pytest.mark.parametrize("dtype", [torch.float32, LOW_DTYPE])
def test_dequantize_is_exact_up_to_one_rounding(n, k, group, dtype):
    w = randn((n, k), torch.float32, 1).to(dtype)
    qweight, scales, zeros = (t.to(DEVICE) for t in quantize_int4_weight(w, group))
    got = int4_dequantize(qweight, scales, zeros, dtype)  # [K, N]
    assert got.shape == (k, n) and got.dtype == dtype
    assert torch.equal(got, dequantize_int4(qweight, scales, zeros).t().to(dtype))


@pytest.mark.parametrize("m", [17, 40])
@pytest.mark.parametrize("bias", [False, True])
def test_dequant_matmul_matches_the_reference(m, bias):
    dtype, n, k = LOW_DTYPE, 96, 256
    x = randn((m, k), dtype, 2)
    qweight, scales, zeros = (t.to(DEVICE) for t in quantize_int4_weight(randn((n, k), torch.float32, 3).to(dtype), 32))
    b = randn((n,), dtype, 4) if bias else None
    got = int4_dequant_matmul(x, qweight, scales, zeros, b)
    expected = int4_linear_reference(x, qweight, scales, zeros, b)
    w = dequantize_int4(qweight, scales, zeros)
    assert_within_rounding(got, expected, x, w, b, weight_unit=UNIT[dtype], sum_unit=UNIT[dtype])
