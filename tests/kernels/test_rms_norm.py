"""rms_norm (with or without the residual add) rounds like the ops reference, step by step."""

import pytest
import torch

pytest.importorskip("triton")

from graphllm.kernels.rms_norm import rms_norm, rms_norm_reference  # noqa: E402
from tests.kernels.conftest import LOW_DTYPE, ON_GPU, TOLERANCE, assert_close, randn  # noqa: E402

EPS = 1e-6


def check(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None) -> None:
    out, h = rms_norm(x, weight, EPS, residual)
    expected_out, expected_h = rms_norm_reference(x, weight, EPS, residual)
    assert out.is_contiguous()
    assert_close(out, expected_out)
    if residual is None:
        assert h is None
    else:
        assert h.is_contiguous() and h.dtype == x.dtype
        assert torch.equal(h, expected_h)  # the add rounds exactly like torch's


@pytest.mark.parametrize("dtype", (torch.float32, LOW_DTYPE))
@pytest.mark.parametrize("with_residual", (False, True))
@pytest.mark.parametrize("num_rows", (0, 1, 5))
@pytest.mark.parametrize("dim", (64, 200, 1000))  # 200, 1000: masked tail of BLOCK_D
def test_matches_reference(num_rows, dim, with_residual, dtype):
    x = randn((num_rows, dim), dtype, seed=0)
    weight = 1 + randn((dim,), dtype, seed=1) / 4
    residual = randn((num_rows, dim), dtype, seed=2) if with_residual else None
    check(x, weight, residual)


@pytest.mark.parametrize("dtype", (torch.float32, LOW_DTYPE))
@pytest.mark.parametrize("dim", (3000, 8192))  # num_warps 8 and 16
def test_wide_rows(dim, dtype):
    weight = 1 + randn((dim,), dtype, seed=1) / 4
    check(randn((3, dim), dtype, seed=0), weight, randn((3, dim), dtype, seed=2))


@pytest.mark.parametrize("dtype", (torch.float32, LOW_DTYPE))
@pytest.mark.parametrize("with_residual", (False, True))
def test_strided_rows(with_residual, dtype):
    # x and residual are column slices of wider tensors, like halves of a fused projection output
    x = randn((5, 3 * 96), dtype, seed=0)[:, 96:192]
    residual = randn((5, 2 * 96 + 8), dtype, seed=2)[:, 8:104] if with_residual else None
    weight = 1 + randn((96,), dtype, seed=1) / 4
    check(x, weight, residual)


@pytest.mark.parametrize("with_residual", (False, True))
def test_float32_weight_on_half_input(with_residual):
    # normed is rounded to x's dtype before the float32 scale, so x's tolerance applies
    x = randn((5, 200), LOW_DTYPE, seed=0)
    weight = 1 + randn((200,), torch.float32, seed=1) / 4
    residual = randn((5, 200), LOW_DTYPE, seed=2) if with_residual else None
    out, h = rms_norm(x, weight, EPS, residual)
    expected_out, expected_h = rms_norm_reference(x, weight, EPS, residual)
    assert out.dtype == expected_out.dtype == torch.float32
    tol = TOLERANCE[LOW_DTYPE]
    torch.testing.assert_close(out, expected_out, atol=tol, rtol=tol)
    assert (h is None) == (residual is None)
    assert residual is None or torch.equal(h, expected_h)


@pytest.mark.skipif(not ON_GPU, reason="the interpreter compiles nothing")
def test_varying_rows_share_one_compile():
    from graphllm.kernels.rms_norm import _rms_norm_kernel
    weight = 1 + randn((64,), torch.float32, seed=1) / 4
    check(randn((1, 64), torch.float32, seed=0), weight, None)
    kernel_cache = _rms_norm_kernel.device_caches[torch.cuda.current_device()][0]
    compiled = len(kernel_cache)
    for num_rows in (3, 7, 33):
        check(randn((num_rows, 64), torch.float32, seed=num_rows), weight, None)
    assert len(kernel_cache) == compiled


@pytest.mark.parametrize("dtype", (torch.float32, LOW_DTYPE))
@pytest.mark.parametrize("with_residual", (False, True))
def test_unit_offset_scales_by_one_plus_weight_in_float32(with_residual, dtype):
    """Gemma's norm: (h * rstd * (1 + w)) in float32, one rounding, in x's dtype."""
    x, weight = randn((5, 200), dtype, seed=0), randn((200,), dtype, seed=1) / 4
    residual = randn((5, 200), dtype, seed=2) if with_residual else None
    out, h = rms_norm(x, weight, EPS, residual, unit_offset=True)
    want, want_h = rms_norm_reference(x, weight, EPS, residual, unit_offset=True)
    assert out.dtype == x.dtype and (h is None) == (residual is None)
    assert_close(out, want)
    ones = rms_norm(x, weight + 1, EPS, residual)[0]  # the same up to 1 + w's rounding in the weight's dtype
    assert not torch.equal(out, ones) or dtype == torch.float32
