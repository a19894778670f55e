"""The fused custom ops equal the plain PyTorch they replace (bit for bit on CPU), and pass opcheck."""

import pytest
import torch
import torch.nn.functional as F

import graphllm.ops.rms_norm  # noqa: F401  (registers the ops)
import graphllm.ops.silu_and_mul  # noqa: F401
from graphllm.models.layers import RMSNorm

DTYPES = (torch.float32, torch.bfloat16)
SHAPES = ((1, 64), (7, 128), (5, 4, 32), (0, 64))  # [T, H], Qwen3's per-head [T, heads, D], no tokens
EPS = 1e-6


def random_norm(dim: int, dtype: torch.dtype, seed: int = 0) -> RMSNorm:
    norm = RMSNorm(dim, EPS)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(dim, generator=torch.Generator().manual_seed(seed)) * 0.5 + 1)
    return norm.to(dtype)


def randn(shape, dtype: torch.dtype, seed: int) -> torch.Tensor:
    return (torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 3).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_rms_norm_equals_the_module(shape, dtype):
    norm, x = random_norm(shape[-1], dtype), randn(shape, dtype, seed=1)
    with torch.no_grad():
        expected = norm(x)
    got = torch.ops.graphllm.rms_norm(x, norm.weight.detach(), EPS)
    assert got.dtype == dtype and got.shape == shape and got.is_contiguous()
    assert torch.equal(got, expected)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_add_rms_norm_equals_add_then_module(shape, dtype):
    norm, x, residual = random_norm(shape[-1], dtype), randn(shape, dtype, 1), randn(shape, dtype, 2)
    x_before, residual_before = x.clone(), residual.clone()
    out, new_residual = torch.ops.graphllm.add_rms_norm(x, residual, norm.weight.detach(), EPS)
    with torch.no_grad():
        expected = norm(x + residual)
    assert torch.equal(new_residual, x + residual) and new_residual.dtype == dtype
    assert torch.equal(out, expected) and out.dtype == dtype
    assert torch.equal(x, x_before) and torch.equal(residual, residual_before)  # functional


@pytest.mark.parametrize("shape", ((3, 64), (5, 4, 32)))
def test_rms_norm_matches_the_formula_in_float64(shape):
    """The module and op agree with each other; this pins both to the definition."""
    x, weight = randn(shape, torch.float32, 3), randn(shape[-1:], torch.float32, 4)
    x64 = x.double()
    expected = weight.double() * x64 / torch.sqrt(x64.pow(2).mean(-1, keepdim=True) + EPS)
    torch.testing.assert_close(torch.ops.graphllm.rms_norm(x, weight, EPS).double(), expected,
                               rtol=1e-5, atol=1e-5)


def test_rms_norm_promotes_like_the_module():
    """A bfloat16 input with a float32 weight gives float32, as `weight * x.to(dtype)` does."""
    x, weight = randn((3, 64), torch.bfloat16, 5), randn((64,), torch.float32, 6)
    got = torch.ops.graphllm.rms_norm(x, weight, EPS)
    xf = x.float()
    expected = weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype)
    assert got.dtype == torch.float32 and torch.equal(got, expected)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", ((1, 256), (7, 128), (5, 3, 64), (0, 128)))
def test_silu_and_mul_equals_split_silu_mul(shape, dtype):
    x = randn(shape, dtype, seed=7)
    gate, up = torch.split(x, [shape[-1] // 2] * 2, dim=-1)
    got = torch.ops.graphllm.silu_and_mul(x)
    assert got.dtype == dtype and got.shape == (*shape[:-1], shape[-1] // 2) and got.is_contiguous()
    assert torch.equal(got, F.silu(gate) * up)


def test_silu_and_mul_matches_the_formula_in_float64():
    x = randn((4, 128), torch.float32, 8)
    gate, up = x.double()[:, :64], x.double()[:, 64:]
    expected = gate / (1 + torch.exp(-gate)) * up
    torch.testing.assert_close(torch.ops.graphllm.silu_and_mul(x).double(), expected, rtol=1e-5, atol=1e-5)


def test_silu_and_mul_refuses_an_odd_width():
    with pytest.raises(RuntimeError, match="even"):
        torch.ops.graphllm.silu_and_mul(torch.zeros(2, 5))


def opcheck_samples(dtype: torch.dtype) -> list:
    x, residual = randn((6, 64), dtype, 9), randn((6, 64), dtype, 10)
    heads = randn((6, 4, 32), dtype, 11)
    w64, w32 = randn((64,), dtype, 12), randn((32,), dtype, 13)
    return [
        (torch.ops.graphllm.rms_norm.default, (x, w64, EPS)),
        (torch.ops.graphllm.rms_norm.default, (heads, w32, EPS)),
        (torch.ops.graphllm.rms_norm.default, (heads.transpose(0, 1), w32, EPS)),  # strided input
        (torch.ops.graphllm.add_rms_norm.default, (x, residual, w64, EPS)),
        (torch.ops.graphllm.silu_and_mul.default, (x,)),
        (torch.ops.graphllm.silu_and_mul.default, (heads,)),
    ]


@pytest.mark.parametrize("dtype", DTYPES)
def test_opcheck(dtype):
    for op, args in opcheck_samples(dtype):
        torch.library.opcheck(op, args)
