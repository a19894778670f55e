"""fp8_matmul equals fp8_linear_reference within rounding, for dynamic and static activation scales, every
tile path (one-row multiply-add, 16-row dot tiles plain and with the weight on the MMA's M side, GEMM tiles,
x quantized in the kernel or beforehand by fp8_quantize_rows), K split and ragged edge, and past 16 rows
through torch._scaled_mm on the GPU.

Triton's CPU interpreter casts float32 to float8 wrongly where rounding carries into the exponent (triton 3.9:
31.08 -> 16, torch: 32), so on CPU the activations are float8 values times a power of two, whose quantization
is exact: the tests there check indexing, scales, masks and sums, and the rounding tests run on the GPU."""

import itertools

import pytest
import torch

pytest.importorskip("triton")

from graphllm.kernels.fp8_matmul import (  # noqa: E402
    default_config, fp8_linear_reference, fp8_matmul, fp8_matmul_quantized, fp8_quantize_rows,
    fp8_quantized_linear_reference, scaled_mm_takes)
from graphllm.kernels.quant_layout import (  # noqa: E402
    FP8_DTYPE, dequantize_per_channel, quantize_fp8_rows, quantize_fp8_weight)
from graphllm.kernels.skinny_matmul import split_k_counters  # noqa: E402
from tests.kernels.conftest import DEVICE, LOW_DTYPE, ON_GPU, gpu_only, randn  # noqa: E402
from tests.kernels.test_int8_matmul import SUM_UNIT, assert_within_rounding, gpu_randn  # noqa: E402

# Hopper's float8 MMA keeps about 14 bits while it sums one K step (at most 8 MMAs of 32 products): 2^-11
SUM_UNIT_FP8 = 2.0 ** -11 if ON_GPU else SUM_UNIT
EXACT_SHIFT = 2.0 ** -6  # CPU activations: float8 values times this; one per row is 448 (so the scale is this)


def activations(m: int, k: int, dtype: torch.dtype, seed: int, static: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(x [M, K], input_scale or None). GPU: random rows (static: a scale that clamps some values). CPU: rows
    whose quantization is exact (see the module docstring)."""
    if ON_GPU:
        x = randn((m, k), dtype, seed)
        return x, (x.float().abs().amax().reshape(1) / 600.0 if static else None)
    v = randn((m, k), torch.float32, seed).mul(60).clamp(-448, 448).to(FP8_DTYPE).float()
    v[:, seed % k] = 448.0  # the row's max: dynamic scale = EXACT_SHIFT exactly
    scale = torch.tensor([EXACT_SHIFT], device=DEVICE) if static else None
    return (v * EXACT_SHIFT).to(dtype), scale


def check(m: int, n: int, k: int, dtype: torch.dtype, bias: bool, static: bool = False, config: dict | None = None,
          seed: int = 0):
    x, input_scale = activations(m, k, dtype, seed, static)
    weight, weight_scale = quantize_fp8_weight(randn((n, k), torch.float32, seed + 1) / k ** 0.5)
    check_with(x, input_scale, weight, weight_scale, randn((n,), dtype, seed + 2) if bias else None, config)


def check_with(x, input_scale, weight, weight_scale, b, config=None):
    got = fp8_matmul(x, weight, weight_scale, input_scale, b, config)
    xq, x_scale = quantize_fp8_rows(x, input_scale)
    # float8 products are exact: only the summation (float32, or the fp8 MMA's within a step) differs
    assert_within_rounding(got, fp8_linear_reference(x, weight, weight_scale, input_scale, b),
                           xq.float() * x_scale, dequantize_per_channel(weight, weight_scale), b,
                           sum_unit=SUM_UNIT_FP8)


@pytest.mark.parametrize("dtype", (torch.float32, LOW_DTYPE))
@pytest.mark.parametrize("m", (1, 2, 5, 16, 33))
@pytest.mark.parametrize("n, k, bias, static", [(64, 128, False, False), (96, 256, True, False),
                                                (96, 256, False, True)])
def test_default_configs_match_reference(m, n, k, bias, static, dtype):
    check(m, n, k, dtype, bias, static)


def tiles(**overrides) -> dict:
    return {"BLOCK_N": 32, "BLOCK_K": 64, "num_warps": 4, "num_stages": 2, **overrides}


@pytest.mark.parametrize("m, config", [
    (1, tiles(BLOCK_M=1, SPLIT_K=3, FUSE_QUANT=True)),  # one row, x quantized in the kernel, unequal splits
    (1, tiles(BLOCK_M=1, FUSE_QUANT=False)),  # x quantized beforehand
    (3, tiles(BLOCK_M=16, BLOCK_N=64, SWAP_AB=True, SPLIT_K=3, FUSE_QUANT=True)),
    (16, tiles(BLOCK_M=16, SPLIT_K=2, FUSE_QUANT=False)),
    (40, tiles(BLOCK_M=16, GROUP_M=2, FUSE_QUANT=True)),  # three row tiles, grouped; a given config skips _scaled_mm
    (40, tiles(BLOCK_M=32, BLOCK_N=64, SWAP_AB=True)),
])
@pytest.mark.parametrize("static", (False, True))
def test_tile_paths_and_ragged_edges(m, config, static):
    """N = 80 and K = 200 are multiples of neither tile (masked edges); counters are left at zero."""
    check(m, 80, 200, LOW_DTYPE, bias=True, static=static, config=config)
    check(m, 48, 96, torch.float32, bias=False, static=static, config=config, seed=3)
    assert split_k_counters(DEVICE).count_nonzero() == 0


@pytest.mark.parametrize("static", (False, True))
def test_quantize_rows_equals_the_reference(static):
    x, input_scale = activations(5, 300, LOW_DTYPE, 1, static)
    xq, x_scale = fp8_quantize_rows(x[:, :296], input_scale)  # strided rows
    want_q, want_scale = quantize_fp8_rows(x[:, :296], input_scale)
    assert xq.dtype == FP8_DTYPE and torch.equal(xq.float(), want_q.float())
    assert torch.equal(x_scale, want_scale.reshape(-1))


@pytest.mark.parametrize("m, config", [(1, tiles(BLOCK_M=1)), (5, tiles(BLOCK_M=16, SWAP_AB=True, SPLIT_K=2)),
                                       (3, None), (40, None)])
def test_prequantized_rows(m, config):
    """fp8_matmul_quantized (what fp8_linear_quantized runs): x quantized before, here by the reference, gives
    fp8_quantized_linear_reference, in the output dtype asked for; 40 rows take _scaled_mm on the GPU."""
    x, _ = activations(m, 96, LOW_DTYPE, 4, static=False)
    weight, weight_scale = quantize_fp8_weight(randn((80, 96), torch.float32, 5) / 96 ** 0.5)
    b = randn((80,), LOW_DTYPE, 6)
    xq, x_scale = quantize_fp8_rows(x)
    got = fp8_matmul_quantized(xq, x_scale.reshape(-1), weight, weight_scale, b, LOW_DTYPE, config)
    assert got.dtype == LOW_DTYPE and got.shape == (m, 80)
    assert_within_rounding(got, fp8_quantized_linear_reference(xq, x_scale, weight, weight_scale, b, LOW_DTYPE),
                           xq.float() * x_scale, dequantize_per_channel(weight, weight_scale), b,
                           sum_unit=SUM_UNIT_FP8)


def test_zero_rows_and_routing():
    weight, weight_scale = quantize_fp8_weight(randn((32, 64), torch.float32, 0))
    x = randn((0, 64), LOW_DTYPE, 1)
    assert fp8_matmul(x, weight, weight_scale).shape == (0, 32)
    assert default_config(16, 6144, 4096, DEVICE)["BLOCK_M"] == 16
    assert default_config(17, 6144, 4096, DEVICE)["FUSE_QUANT"] is False
    assert scaled_mm_takes(x.dtype, weight, None) is (ON_GPU and torch.cuda.get_device_capability() >= (8, 9))
    assert not scaled_mm_takes(torch.float16, weight, None)  # row-wise _scaled_mm: bfloat16 out only


@gpu_only
@pytest.mark.parametrize("n, k", [(6144, 4096), (4096, 14336), (28672, 4096), (128256, 4096)])
def test_llama_8b_shapes(n, k):
    """Rows 1..16 through the kernel's default configs, bfloat16 past 16 rows through torch._scaled_mm."""
    weight, weight_scale = quantize_fp8_weight(gpu_randn((n, k)) / k ** 0.5)
    for m, static in itertools.product((1, 8, 16, 17, 64, 256), (False, True)):
        check_with(*activations(m, k, torch.bfloat16, m, static), weight, weight_scale, None)
    assert split_k_counters(DEVICE).count_nonzero() == 0


@pytest.mark.skipif(not ON_GPU, reason="the interpreter's float32 -> float8 cast is wrong (module docstring)")
@pytest.mark.parametrize("m", (1, 4, 16, 33))
def test_rounds_random_activations_like_torch(m):
    """Random activations (float8 rounding on every element, clamping under a small static scale) through
    every path: the in-kernel quantization, fp8_quantize_rows with the dot tiles, and _scaled_mm."""
    for config in (None, tiles(BLOCK_M=1, FUSE_QUANT=True), tiles(BLOCK_M=16, FUSE_QUANT=False),
                   tiles(BLOCK_M=16, BLOCK_N=64, SWAP_AB=True, FUSE_QUANT=True)):
        for static in (False, True):
            check(m, 256, 512, torch.bfloat16, bias=True, static=static, config=config, seed=m)
            check(m, 256, 512, torch.float16, bias=False, static=static, config=config, seed=m + 1)
