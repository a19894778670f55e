"""int8_matmul equals int8_linear_reference within rounding, for every tile path (one-row multiply-add,
16-row dot tiles plain and with the weight on the MMA's M side, GEMM tiles over several row tiles), K
split and ragged edge. assert_within_rounding, the honest tolerance, is shared by the fp8 and int4 tests."""

import pytest
import torch

pytest.importorskip("triton")

from graphllm.kernels.int8_matmul import (  # noqa: E402
    CONFIGS, default_config, int8_matmul, int8_linear_reference, m_bucket, plan_launch)
from graphllm.kernels.quant_layout import dequantize_per_channel, quantize_int8_weight  # noqa: E402
from graphllm.kernels.skinny_matmul import split_k_counters  # noqa: E402
from tests.kernels.conftest import DEVICE, LOW_DTYPE, gpu_only, randn  # noqa: E402

UNIT = {torch.float32: 2.0 ** -24, torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}  # unit roundoff
SUM_UNIT = 2.0 ** -16  # float32 sums of up to 256 terms in another order: K * 2^-24 (CPU); typical on GPU


def assert_within_rounding(got: torch.Tensor, expected: torch.Tensor, x: torch.Tensor, w: torch.Tensor,
                           bias: torch.Tensor | None = None, weight_unit: float = 0.0, sum_unit: float = SUM_UNIT):
    """got and expected (x @ w^T + bias, each rounded once to got's dtype from float32) differ by at most
    their two output roundings (2u |expected|), the float32 summation order (sum_unit * (|x| @ |w|^T + |bias|)),
    and a rounding of w to relative weight_unit where the kernel rounds the weight (weight_unit * |x| @ |w|^T).
    x [M, K], w [N, K]: what the product multiplies, dequantized (float)."""
    assert got.dtype == expected.dtype and got.shape == expected.shape and got.is_contiguous()
    mag = x.float().abs() @ w.float().abs().t()
    bound = 2 * UNIT[got.dtype] * expected.float().abs() + (sum_unit + weight_unit) * mag + 1e-30
    if bias is not None:
        bound += sum_unit * bias.float().abs()
    excess = ((got.float() - expected.float()).abs() - bound).max().item()
    assert excess <= 0, f"error beyond the rounding bound by {excess}"


def int8_case(m: int, n: int, k: int, dtype: torch.dtype, bias: bool, seed: int = 0):
    x = randn((m, k), dtype, seed)
    weight, scale = quantize_int8_weight(randn((n, k), torch.float32, seed + 1) / k ** 0.5)
    b = randn((n,), dtype, seed + 2) if bias else None
    return x, weight, scale, b


def gpu_randn(shape) -> torch.Tensor:
    """A large random float32 tensor made on the GPU (the CPU generator of conftest.randn takes seconds)."""
    return torch.randn(shape, device=DEVICE, generator=torch.Generator(DEVICE).manual_seed(0))


def check(m: int, n: int, k: int, dtype: torch.dtype, bias: bool, config: dict | None = None, seed: int = 0):
    check_with(*int8_case(m, n, k, dtype, bias, seed), config)


def check_with(x, weight, scale, b, config=None):
    got = int8_matmul(x, weight, scale, b, config)
    # int8 is exact in x's dtype and the scale multiplies the float32 sum: only summation order differs
    assert_within_rounding(got, int8_linear_reference(x, weight, scale, b), x, dequantize_per_channel(weight, scale), b)


@pytest.mark.parametrize("dtype", (torch.float32, LOW_DTYPE))
@pytest.mark.parametrize("m", (1, 2, 5, 16, 33))
@pytest.mark.parametrize("n, k, bias", [(64, 128, False), (96, 256, True)])
def test_default_configs_match_reference(m, n, k, bias, dtype):
    check(m, n, k, dtype, bias)


def tiles(**overrides) -> dict:
    return {"BLOCK_N": 32, "BLOCK_K": 64, "num_warps": 4, "num_stages": 2, **overrides}


@pytest.mark.parametrize("m, config", [
    (1, tiles(BLOCK_M=1, SPLIT_K=3)),  # one row, K splits of unequal length
    (1, tiles(BLOCK_M=16)),  # one row in a 16-row dot tile
    (3, tiles(BLOCK_M=16, SPLIT_K=2)),
    (7, tiles(BLOCK_M=16, BLOCK_N=64, SWAP_AB=True, SPLIT_K=3)),  # the weight on the MMA's M side
    (40, tiles(BLOCK_M=16, GROUP_M=2)),  # three row tiles, grouped: every (row, column) tile once
    (3, tiles(BLOCK_M=1)),  # one row per program
])
def test_tile_paths_and_ragged_edges(m, config):
    """N = 80 and K = 200 are multiples of neither tile: masked edges; counters are left at zero."""
    check(m, 80, 200, LOW_DTYPE, bias=True, config=config)
    check(m, 48, 96, torch.float32, bias=False, config=config, seed=3)
    assert split_k_counters(DEVICE).count_nonzero() == 0


def test_strided_rows_and_zero_rows():
    wide = randn((4, 200), LOW_DTYPE, seed=5)
    x = wide[:, 8:136]  # [4, 128], row stride 200
    _, weight, scale, _ = int8_case(4, 32, 128, LOW_DTYPE, False)
    assert_within_rounding(int8_matmul(x, weight, scale), int8_linear_reference(x, weight, scale), x,
                           dequantize_per_channel(weight, scale))
    assert int8_matmul(x[:0], weight, scale).shape == (0, 32)


def test_default_config_routing():
    """One row: multiply-add tiles; 2..16 rows: one 16-row dot tile; more: GEMM tiles without K splits;
    K splits fill the GPU but keep four K steps each."""
    assert default_config(1, 6000, 4096, DEVICE)["BLOCK_M"] == 1
    assert default_config(16, 6000, 4096, DEVICE)["BLOCK_M"] == 16
    assert default_config(17, 6000, 4096, DEVICE)["BLOCK_M"] >= 64
    assert default_config(1, 6144, 4096, DEVICE) == CONFIGS[(1, 6144, 4096)]  # measured entries win
    assert "SPLIT_K" not in default_config(17, 64, 64, DEVICE)
    assert default_config(8, 64, 256, DEVICE)["SPLIT_K"] == 1  # too short to split
    assert [m_bucket(m) for m in (1, 3, 16, 17, 300, 5000)] == [1, 4, 16, 32, 512, 1024]
    plan = plan_launch(40, 80, 200, tiles(BLOCK_M=16, SPLIT_K=4), DEVICE)
    assert plan.split_k == 1 and plan.grid == (9, 1)  # several row tiles: no K split


@gpu_only
@pytest.mark.parametrize("n, k", [(6144, 4096), (4096, 14336), (28672, 4096), (128256, 4096)])
def test_llama_8b_shapes(n, k):
    weight, scale = quantize_int8_weight(gpu_randn((n, k)) / k ** 0.5)
    for m in (1, 2, 8, 16):  # past 16 rows graphllm.int8_linear dequantizes for cuBLAS (tests/ops)
        check_with(randn((m, k), torch.bfloat16, m), weight, scale, None)
    assert split_k_counters(DEVICE).count_nonzero() == 0
