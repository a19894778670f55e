"""The quantized-linear ops compute their references at every row count, through whichever path the
row count takes (on a GPU: the packed-weight kernels up to SMALL_M rows, dequantize + cuBLAS past it
for int8 / int4); and they trace as one node with the right fake shape."""

import pytest
import torch

from graphllm.kernels import quant_layout as Q
from graphllm.ops.quantized_linear import SMALL_M

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
DTYPE = torch.bfloat16 if DEVICE.type == "cuda" else torch.float32
ROWS = [1, 5, SMALL_M, SMALL_M + 1, 64]
N, K = 256, 512


def case(rows: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, K, generator=gen).to(DEVICE, DTYPE)
    w = (torch.randn(N, K, generator=gen) / K ** 0.5).to(DEVICE, DTYPE)
    bias = torch.randn(N, generator=gen).to(DEVICE, DTYPE)
    return x, w, bias


def close(got, expected, scale):
    tol = 2e-2 if DTYPE == torch.bfloat16 else 1e-5
    assert got.shape == expected.shape and got.dtype == expected.dtype
    torch.testing.assert_close(got.float(), expected.float(), atol=tol * scale, rtol=tol)


@pytest.mark.parametrize("rows", ROWS)
def test_int4_linear(rows):
    x, w, bias = case(rows)
    qw, s, z = Q.quantize_int4_weight(w, 128)
    close(torch.ops.graphllm.int4_linear(x, qw, s, z, bias), Q.int4_linear_reference(x, qw, s, z, bias), 1.0)


@pytest.mark.parametrize("rows", ROWS)
def test_int8_linear(rows):
    x, w, bias = case(rows)
    qw, s = Q.quantize_int8_weight(w)
    close(torch.ops.graphllm.int8_linear(x, qw, s, bias), Q.int8_linear_reference(x, qw, s, bias), 1.0)


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("static", [False, True])
def test_fp8_linear(rows, static):
    if DEVICE.type == "cuda" and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("float8 needs compute capability 8.9")
    x, w, bias = case(rows)
    qw, s = Q.quantize_fp8_weight(w)
    input_scale = torch.tensor([x.float().abs().max().item() / 448], device=DEVICE) if static else None
    got = torch.ops.graphllm.fp8_linear(x, qw, s, input_scale, bias)
    close(got, Q.fp8_linear_reference(x, qw, s, input_scale, bias), 1.0)


def test_ops_keep_leading_dims_and_fake_shapes():
    x, w, bias = case(6)
    qw, s, z = Q.quantize_int4_weight(w, 128)
    x3 = x.view(2, 3, K)
    assert torch.ops.graphllm.int4_linear(x3, qw, s, z, None).shape == (2, 3, N)
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode() as mode:
        fake = torch.ops.graphllm.int4_linear(mode.from_tensor(x3), mode.from_tensor(qw), mode.from_tensor(s),
                                              mode.from_tensor(z), None)
    assert fake.shape == (2, 3, N)


def test_fp8_quantize_of_one_row_with_a_static_scale_returns_no_alias():
    """Regression: one row under a checkpoint's static input_scale [1] gave back input_scale itself, which a
    custom op may not return (PyTorch refused it in eager graphs of pre-quantized fp8 checkpoints)."""
    scale = torch.tensor([0.05])
    xq, out = torch.ops.graphllm.fp8_quantize(torch.randn(1, 16), scale)
    assert out.tolist() == [[pytest.approx(0.05)]] and out.data_ptr() != scale.data_ptr()
