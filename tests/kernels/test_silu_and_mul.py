"""silu_and_mul equals silu(gate) * up in x's dtype, rounded like the ops reference."""

import pytest
import torch

pytest.importorskip("triton")

from graphllm.kernels.silu_and_mul import silu_and_mul, silu_and_mul_reference  # noqa: E402
from tests.kernels.conftest import LOW_DTYPE, assert_close, randn  # noqa: E402


def check(x: torch.Tensor) -> None:
    out = silu_and_mul(x)
    assert out.is_contiguous()
    assert_close(out, silu_and_mul_reference(x))


@pytest.mark.parametrize("dtype", (torch.float32, LOW_DTYPE))
@pytest.mark.parametrize("num_rows", (0, 1, 5))
@pytest.mark.parametrize("size", (64, 200, 1500))  # 200: masked tail; 1500: two column blocks
def test_matches_reference(num_rows, size, dtype):
    check(randn((num_rows, 2 * size), dtype, seed=0) * 3)  # * 3: reach silu's flat and linear parts


@pytest.mark.parametrize("dtype", (torch.float32, LOW_DTYPE))
def test_strided_rows(dtype):
    wide = randn((5, 2 * 200 + 24), dtype, seed=0) * 3
    check(wide[:, 8:408])  # row stride 424, last dim contiguous


def test_rejects_odd_width():
    with pytest.raises(AssertionError):
        silu_and_mul(randn((2, 7), torch.float32, seed=0))


@pytest.mark.parametrize("dtype", (torch.float32, LOW_DTYPE))
@pytest.mark.parametrize("num_rows", (1, 5))
def test_gelu_tanh_matches_gemmas_geglu(num_rows, dtype):
    from graphllm.kernels.reference import reference_gelu_tanh_and_mul
    from graphllm.kernels.silu_and_mul import gelu_tanh_and_mul
    x = randn((num_rows, 2 * 1500), dtype, seed=1) * 4  # * 4: tanh's saturated ends too
    out = gelu_tanh_and_mul(x)
    assert_close(out, reference_gelu_tanh_and_mul(x))
    assert not torch.allclose(out.float(), silu_and_mul_reference(x).float(), atol=1e-2)


@pytest.mark.parametrize("gelu", (False, True))
@pytest.mark.parametrize("dtype", (torch.float32, LOW_DTYPE))
def test_interleaved_is_the_halves_kernel_on_the_halves(dtype, gelu):
    """Columns gate 0, up 0, gate 1, ... give exactly what the kernel gives on [gate; up]; with a row stride and
    a masked tail (1,500 columns: two blocks)."""
    wide = randn((5, 2 * 1500 + 24), dtype, seed=2) * 4
    x = wide[:, 8:3008]
    interleaved = torch.stack((x[:, :1500], x[:, 1500:]), dim=-1).flatten(1)
    strided = torch.empty((5, 3024), dtype=dtype, device=x.device)[:, 24:]
    strided.copy_(interleaved)
    for xi in (interleaved, strided):
        assert torch.equal(silu_and_mul(xi, gelu=gelu, interleaved=True), silu_and_mul(x, gelu=gelu))
