"""skinny_matmul equals x @ W^T (+ bias) computed in float32, for every tile path and ragged edge."""

import pytest
import torch

pytest.importorskip("triton")

from graphllm.kernels.skinny_matmul import MAX_ROWS, beats_cublas, default_config, skinny_matmul, skinny_matmul_reference  # noqa: E402
from tests.kernels.conftest import DEVICE, LOW_DTYPE, assert_close, gpu_only, randn  # noqa: E402


def check(m: int, n: int, k: int, dtype: torch.dtype, bias: bool, config: dict | None = None, seed: int = 0):
    x = randn((m, k), dtype, seed)
    w = randn((n, k), dtype, seed + 1) / k ** 0.5
    b = randn((n,), dtype, seed + 2) if bias else None
    got = skinny_matmul(x, w, b, config)
    assert got.is_contiguous()
    assert_close(got, skinny_matmul_reference(x, w, b))


@pytest.mark.parametrize("dtype", (torch.float32, LOW_DTYPE))
@pytest.mark.parametrize("m", (1, 3, MAX_ROWS))
@pytest.mark.parametrize("n, k, bias", [(64, 128, False), (48, 96, True), (80, 256, False)])
def test_matches_reference(m, n, k, bias, dtype):
    # (48, 96): N not a multiple of BLOCK_N and K not a multiple of BLOCK_K (masked edges)
    check(m, n, k, dtype, bias, {"BLOCK_N": 32, "BLOCK_K": 64, "num_warps": 4, "num_stages": 2})


@pytest.mark.parametrize("m", (1, 8))
def test_default_config_paths(m):
    check(m, 96, 160, LOW_DTYPE, bias=True)


def test_strided_rows():
    """x may be a row slice of a wider tensor (the logits rows of a step); only the last dim must be dense."""
    wide = randn((4, 200), LOW_DTYPE, seed=5)
    x = wide[:, 8:136]  # [4, 128], row stride 200
    w = randn((32, 128), LOW_DTYPE, seed=6) / 128 ** 0.5
    assert_close(skinny_matmul(x, w, config={"BLOCK_N": 16, "BLOCK_K": 64, "num_warps": 4, "num_stages": 2}),
                 skinny_matmul_reference(x, w))


def test_zero_rows():
    out = skinny_matmul(randn((0, 64), LOW_DTYPE, 0), randn((32, 64), LOW_DTYPE, 1))
    assert out.shape == (0, 32)


def test_default_config_and_routing():
    """Wide outputs get 64-column tiles, narrow ones 16 (one row) or 32; K tiles never exceed K's power of two."""
    assert default_config(1, 1 << 20, 4096, DEVICE)["BLOCK_N"] == 64
    assert default_config(1, 64, 4096, DEVICE)["BLOCK_N"] == 16
    assert default_config(8, 64, 4096, DEVICE)["BLOCK_N"] == 32
    assert default_config(1, 64, 48, DEVICE)["BLOCK_K"] == 64
    assert beats_cublas(1, 6144, 4096) and beats_cublas(16, 128256, 4096)
    assert not beats_cublas(8, 6144, 4096) and not beats_cublas(1, 28672, 4096)
    assert not beats_cublas(17, 128256, 4096)


@gpu_only
@pytest.mark.parametrize("m", (1, 2, 8, 16))
@pytest.mark.parametrize("n, k", [(6144, 4096), (4096, 4096), (4096, 14336), (28672, 4096), (128256, 4096)])
def test_llama_8b_shapes(m, n, k):
    check(m, n, k, torch.bfloat16, bias=False)
