"""int4_matmul equals int4_linear_reference within rounding, for group sizes 32, 128 and per-channel (G = K),
every tile path (one-row multiply-add, 16-row dot tiles on either MMA side, GEMM tiles), K split and ragged
edge. Where a dot tile's K step spans groups the kernel rounds the dequantized weight to x's dtype
(int4_matmul's docstring): there it must equal the reference with that weight tightly, and the float32
reference within the weight's rounding."""

import pytest
import torch

pytest.importorskip("triton")

from graphllm.kernels.int4_matmul import (  # noqa: E402
    default_config, gemv, gemv_f16, int4_linear_reference, int4_matmul, weight_rounds)
from graphllm.kernels.quant_layout import dequantize_int4, quantize_int4_weight  # noqa: E402
from graphllm.kernels.skinny_matmul import split_k_counters  # noqa: E402
from tests.kernels.conftest import DEVICE, LOW_DTYPE, gpu_only, randn  # noqa: E402
from tests.kernels.test_int8_matmul import UNIT, assert_within_rounding, gpu_randn  # noqa: E402


def int4_case(m: int, n: int, k: int, group_size: int, dtype: torch.dtype, bias: bool, seed: int = 0):
    x = randn((m, k), dtype, seed)
    qweight, scales, zeros = quantize_int4_weight(randn((n, k), dtype, seed + 1) / k ** 0.5, group_size)
    return x, (qweight, scales, zeros), randn((n,), dtype, seed + 2) if bias else None


def check(m: int, n: int, k: int, group_size: int, dtype: torch.dtype, bias: bool, config: dict | None = None,
          seed: int = 0) -> bool:
    x, packed, b = int4_case(m, n, k, group_size, dtype, bias, seed)
    return check_with(x, packed, b, config)


def check_with(x, packed, b, config=None, w=None) -> bool:
    """Checks int4_matmul(x, *packed, b, config); w: the dequantized weight if at hand. Whether it rounded W. A
    config (or default) on the GEMV's packed float16 path takes check_f16's bound."""
    (m, k), n, dtype = x.shape, packed[0].shape[1], x.dtype
    group_size = k // packed[1].shape[0]
    chosen = config or default_config(m, n, k, DEVICE)
    if gemv(m, k, group_size, chosen) and gemv_f16(x, chosen):
        check_f16(x, packed, b, config)
        return False
    got = int4_matmul(x, *packed, b, config)
    w = dequantize_int4(*packed) if w is None else w  # float32 [N, K], exact
    rounds = weight_rounds(m, k, group_size, chosen)
    if rounds:  # the kernel's weight: W rounded once to x's dtype
        w_rounded = w.to(dtype).float()
        want = (x.float() @ w_rounded.t() + (0 if b is None else b.float())).to(dtype)
        assert_within_rounding(got, want, x, w_rounded, b)
    assert_within_rounding(got, int4_linear_reference(x, *packed, b), x, w, b,
                           weight_unit=UNIT[dtype] if rounds else 0.0)
    return rounds


@pytest.mark.parametrize("dtype", (torch.float32, LOW_DTYPE))
@pytest.mark.parametrize("m", (1, 2, 5, 16, 33))
@pytest.mark.parametrize("n, k, group_size, bias", [
    (64, 128, 32, True), (64, 128, 128, False),  # G = K: one group per output channel
    (96, 256, 32, False), (96, 256, 128, True), (96, 256, 256, False)])
def test_default_configs_match_reference(m, n, k, group_size, bias, dtype):
    check(m, n, k, group_size, dtype, bias)


def tiles(**overrides) -> dict:
    return {"BLOCK_N": 32, "BLOCK_K": 128, "num_warps": 4, "num_stages": 2, **overrides}


@pytest.mark.parametrize("m, group_size, config, rounds", [
    (1, 32, tiles(BLOCK_M=1, BLOCK_K=64, SPLIT_K=3), False),  # one row, steps across groups, unequal splits
    (1, 64, tiles(BLOCK_M=1, BLOCK_K=32, SPLIT_K=2), False),  # steps inside groups (per-step scale)
    (1, 32, tiles(BLOCK_M=1, BLOCK_K=64, SPLIT_K=3, ROW_SUM=True), False),  # per-word sums, steps across groups
    (1, 64, tiles(BLOCK_M=1, BLOCK_K=32, ROW_SUM=True), False),  # ... steps inside groups
    (1, 64, tiles(BLOCK_M=1, BLOCK_K=32, GEMV=True, SPLIT_K=2), False),  # the GEMV kernel: two column halves
    (1, 128, tiles(BLOCK_M=1, BLOCK_N=64, BLOCK_K=128, GEMV=True, SPLIT_K=3), False),  # ... a step per group
    (1, 32, tiles(BLOCK_M=1, BLOCK_K=64, GEMV=True), False),  # steps across groups: the multiply-add tile
    (1, 64, tiles(BLOCK_M=1, BLOCK_K=32, GEMV=True, PREFETCH=True, SPLIT_K=2), False),  # next step loaded first
    (1, 128, tiles(BLOCK_M=1, BLOCK_N=64, BLOCK_K=64, GEMV=True, PREFETCH=True), False),
    (1, 64, tiles(BLOCK_M=16, SPLIT_K=2), True),  # one row in a 16-row dot tile, steps across groups
    (4, 128, tiles(BLOCK_M=16, SPLIT_K=2), False),  # steps inside groups: scale after the dot, exact
    (4, 32, tiles(BLOCK_M=16, BLOCK_K=16), False),  # dot tiles take K steps of at least 32: one group each
    (3, 128, tiles(BLOCK_M=16, SWAP_AB=True, SPLIT_K=2), False),  # the weight on the MMA's M side, one group
    (3, 32, tiles(BLOCK_M=16, BLOCK_K=64, SWAP_AB=True), True),  # ... steps across groups
    (1, 128, tiles(BLOCK_M=16, PAIRS=True, SPLIT_K=2), False),  # nibble pairs, one row in a 16-row dot tile
    (5, 64, tiles(BLOCK_M=16, BLOCK_K=64, PAIRS=True), False),  # ... steps inside groups
    (3, 128, tiles(BLOCK_M=16, BLOCK_K=32, SWAP_AB=True, PAIRS=True, SPLIT_K=3), False),  # ... swapped
    (3, 32, tiles(BLOCK_M=16, BLOCK_K=64, PAIRS=True), True),  # steps across groups: not pairs (rounds)
    (2, 128, tiles(BLOCK_M=16, PAIRS=2, SPLIT_K=2), False),  # a dot per nibble plane
    (16, 128, tiles(BLOCK_M=16, SWAP_AB=True, PAIRS=2), False),  # ... swapped
    (40, 64, tiles(BLOCK_M=16, GROUP_M=2), True),  # three row tiles, grouped
    (40, 128, tiles(BLOCK_M=32, BLOCK_N=64), False),
])
def test_tile_paths_and_ragged_edges(m, group_size, config, rounds):
    """N = 80 and K = 384 are not multiples of the tiles (masked edges); counters are left at zero."""
    assert check(m, 80, 384, group_size, LOW_DTYPE, bias=True, config=config) == rounds
    check(m, 48, 128, group_size, torch.float32, bias=False, config=config, seed=3)
    assert split_k_counters(DEVICE).count_nonzero() == 0


def test_gemv_takes_steps_inside_groups_only():
    assert gemv(1, 384, 64, tiles(BLOCK_M=1, BLOCK_K=64, GEMV=True))
    assert not gemv(1, 384, 32, tiles(BLOCK_M=1, BLOCK_K=64, GEMV=True))  # a step spans two groups
    assert not gemv(2, 384, 64, tiles(BLOCK_M=16, BLOCK_K=64, GEMV=True))  # rows past one: dot tiles
    assert not gemv(1, 384, 64, tiles(BLOCK_M=1, BLOCK_K=64))


def test_gemv_every_nibble_value_and_extreme_scales():
    """Every nibble value at every position of a word (the shifts and masks of _gemv_word_terms, the sign bit
    of nibble 7 included), zeros 0 and 15, scales from 2^-20 to 2^10: against the float32 reference."""
    n, k, group_size = 64, 256, 64
    q = torch.arange(n * k).reshape(n, k) % 16
    q = (q + torch.arange(n)[:, None]) % 16  # each column sees every value at every nibble position
    qweight = torch.zeros((k // 8, n), dtype=torch.int32)
    for j in range(8):
        qweight |= (q[:, j::8].t().to(torch.int32) & 0xF) << (4 * j)
    zeros = torch.tensor([0.0, 15.0, 8.0, 3.0]).repeat(n, 1).t().contiguous()  # [K/G, N]
    scales = (2.0 ** torch.linspace(-20, 10, n * k // group_size)).reshape(k // group_size, n)
    for dtype in (torch.float32, LOW_DTYPE):
        packed = (qweight.to(DEVICE), scales.to(dtype).to(DEVICE), zeros.to(dtype).to(DEVICE))
        check_with(randn((1, k), dtype, seed=9), packed, None, tiles(BLOCK_M=1, BLOCK_N=32, BLOCK_K=64, GEMV=True))


def check_f16(x, packed, b, config):
    """int4_matmul with the GEMV's packed float16 arithmetic (config F16) against the float32 reference: beyond
    the float32 bound, float16's roundings of x' and of the products and sums of x' (q - 8), relative 2^-7 of
    |x| @ |(q - 8) s|^T (a lane sums 8 products of a word pair, each rounded once, and x' is rounded once)."""
    qweight, scales, zeros = packed
    got = int4_matmul(x, *packed, b, config)
    w = dequantize_int4(*packed)
    w8 = dequantize_int4(qweight, scales, torch.full_like(zeros, 8.0))  # (q - 8) s: what float16 multiplies
    mag = x.float().abs() @ (w.abs() + w8.abs()).t()
    want = int4_linear_reference(x, *packed, b)
    bound = 2 * UNIT[x.dtype] * want.float().abs() + (2.0 ** -7) * mag + 1e-30
    excess = ((got.float() - want.float()).abs() - bound).max().item()
    assert excess <= 0, f"error beyond the float16 bound by {excess}"


@pytest.mark.parametrize("group_size, config", [
    (64, tiles(BLOCK_M=1, BLOCK_K=32, GEMV=True, F16=True, SPLIT_K=2)),  # word rows in pairs, two splits
    (128, tiles(BLOCK_M=1, BLOCK_N=64, BLOCK_K=128, GEMV=True, F16=True, SPLIT_K=3)),  # a step per group
    (64, tiles(BLOCK_M=1, BLOCK_K=64, GEMV=True, F16=True, PREFETCH=True)),  # PREFETCH has no F16 loop: ignored
    (64, tiles(BLOCK_M=1, BLOCK_N=64, BLOCK_K=32, GEMV=True, F16=4, SPLIT_K=2)),  # four column parts
    (128, tiles(BLOCK_M=1, BLOCK_N=32, BLOCK_K=128, GEMV=True, F16=4)),  # ... of 8 columns, N ragged
])
def test_gemv_f16_matches_reference(group_size, config):
    """The GEMV's packed float16 path (F16: x scaled per word-row pair by a power of two, q - 8 in float16, the
    zero point's (8 - z) sum(x) in float32), ragged N, with bias: on CPU its emulation under the interpreter,
    on a GPU its PTX. float32 x keeps the float32 path (F16 needs 16-bit x)."""
    assert gemv(1, 384, group_size, config)
    x, packed, b = int4_case(1, 80, 384, group_size, LOW_DTYPE, True, seed=4)
    check_f16(x, packed, b, config)
    x32, packed32, _ = int4_case(1, 48, 128, group_size, torch.float32, False, seed=3)
    check_with(x32, packed32, None, config)
    assert split_k_counters(DEVICE).count_nonzero() == 0


@pytest.mark.parametrize("n", (64, 80))  # whole column tiles (EVEN_N: loads without masks) and a ragged last one
@pytest.mark.parametrize("m, config", [(1, tiles(BLOCK_M=1, BLOCK_K=32, GEMV=True, SPLIT_K=2)),
                                       (1, tiles(BLOCK_M=1, BLOCK_K=32, GEMV=True, PREFETCH=True)),
                                       (1, tiles(BLOCK_M=1, BLOCK_K=32, GEMV=True, F16=4, SPLIT_K=2)),
                                       (4, tiles(BLOCK_M=16, BLOCK_K=32, SPLIT_K=2)),  # a dot tile's step in a group
                                       (4, tiles(BLOCK_M=16, BLOCK_K=64))])  # ... across groups (96: not for 32)
def test_groups_of_any_size_and_whole_column_tiles(n, m, config):
    """The kernels find a step's group by a shift where G is a power of two (32) and by a division where it is not
    (96); the GEMV loads whole column tiles (N a multiple of BLOCK_N) without masks."""
    for group_size in (96, 32):
        assert gemv(m, 384, group_size, config) == (m == 1)
        x, packed, b = int4_case(m, n, 384, group_size, LOW_DTYPE, True, seed=6)
        if config.get("F16"):
            check_f16(x, packed, b, config)
        else:
            check_with(x, packed, b, config)


def test_gemv_f16_every_nibble_magnitudes_and_zero_pairs():
    """Every nibble value at every position, zeros 0 and 15, and x whose word-row pairs span magnitudes 2^-10 ..
    2^6 (each pair scaled by its own power of two; float16 outputs stay finite), one pair all zeros, one holding a
    single nonzero value."""
    n, k, group_size = 64, 256, 64
    q = (torch.arange(n * k).reshape(n, k) % 16 + torch.arange(n)[:, None]) % 16
    qweight = torch.zeros((k // 8, n), dtype=torch.int32)
    for j in range(8):
        qweight |= (q[:, j::8].t().to(torch.int32) & 0xF) << (4 * j)
    zeros = torch.tensor([0.0, 15.0, 8.0, 3.0]).repeat(n, 1).t().contiguous()
    scales = (2.0 ** torch.linspace(-8, -2, n * k // group_size)).reshape(k // group_size, n)
    x = randn((1, k), torch.float32, seed=11).cpu() * (2.0 ** torch.linspace(-10, 6, k // 16)).repeat_interleave(16)
    x[0, 32:48] = 0.0  # a pair of word rows of zeros
    x[0, 64:80] = 0.0
    x[0, 70] = 3.0  # a pair with one nonzero value
    for dtype in (LOW_DTYPE,):
        packed = (qweight.to(DEVICE), scales.to(dtype).to(DEVICE), zeros.to(dtype).to(DEVICE))
        for parts in (2, 4):
            check_f16(x.to(dtype).to(DEVICE), packed, None, tiles(BLOCK_M=1, BLOCK_N=32, BLOCK_K=64, GEMV=True,
                                                                  F16=parts))


def test_strided_rows_and_zero_rows():
    x_wide = randn((3, 200), LOW_DTYPE, seed=5)
    x = x_wide[:, 8:136]  # [3, 128], row stride 200
    _, packed, _ = int4_case(3, 32, 128, 32, LOW_DTYPE, False)
    config = tiles(BLOCK_M=1)
    assert_within_rounding(int4_matmul(x, *packed, config=config), int4_linear_reference(x, *packed), x,
                           dequantize_int4(*packed))
    assert int4_matmul(x[:0], *packed).shape == (0, 32)


def test_refuses_a_group_size_the_layout_cannot_hold():
    x, (qweight, _, _), _ = int4_case(1, 32, 96, 32, LOW_DTYPE, False)
    groups = torch.ones((8, 32), dtype=LOW_DTYPE, device=DEVICE)  # G = 96 / 8 = 12: not a multiple of 8
    with pytest.raises(ValueError, match="group size 12"):
        int4_matmul(x, qweight, groups, groups)


@gpu_only
@pytest.mark.parametrize("n, k", [(6144, 4096), (4096, 14336), (28672, 4096), (128256, 4096)])
def test_llama_8b_shapes(n, k):
    packed = quantize_int4_weight((gpu_randn((n, k)) / k ** 0.5).to(torch.bfloat16), 128)
    w = dequantize_int4(*packed)
    for m in (1, 2, 8, 16, 64, 256):
        check_with(randn((m, k), torch.bfloat16, m), packed, None, w=w)
    for bn, stages, split, prefetch in [(256, 1, 8, False), (512, 3, 4, False), (128, 1, 16, True)]:  # the GEMV kernel
        gemv_config = {"BLOCK_M": 1, "BLOCK_N": bn, "BLOCK_K": 128, "num_warps": 4, "num_stages": stages,
                       "SPLIT_K": split, "GEMV": True, "PREFETCH": prefetch}
        check_with(randn((1, k), torch.bfloat16, 7), packed, None, gemv_config, w=w)
        check_f16(randn((1, k), torch.bfloat16, 8), packed, None, dict(gemv_config, F16=True))  # its PTX
        check_f16(randn((1, k), torch.bfloat16, 9), packed, None, dict(gemv_config, F16=4))
    assert split_k_counters(DEVICE).count_nonzero() == 0


def act_of_pairs(y: torch.Tensor, gelu: bool) -> torch.Tensor:
    """silu_and_mul (gelu: GeGLU) over y's column pairs (gate j, up j), in y's dtype: the unfused ops."""
    from graphllm.kernels.reference import reference_gelu_tanh_and_mul, reference_silu_and_mul
    pairs = torch.cat((y[:, 0::2], y[:, 1::2]), dim=1)
    return (reference_gelu_tanh_and_mul if gelu else reference_silu_and_mul)(pairs.cpu()).to(y.device)


@pytest.mark.parametrize("gelu", (False, True))
@pytest.mark.parametrize("dtype", (torch.float32, LOW_DTYPE))
@pytest.mark.parametrize("config", [tiles(BLOCK_M=1, BLOCK_K=32, GEMV=True, SPLIT_K=3),  # the last split's program
                                    tiles(BLOCK_M=1, BLOCK_K=64, GEMV=True, PREFETCH=True),  # no split
                                    tiles(BLOCK_M=1, BLOCK_N=64, BLOCK_K=32, GEMV=True, F16=4, SPLIT_K=2)])
def test_gemv_activation_epilogue(config, dtype, gelu):
    """epilogue: the GEMV over an interleaved gate_up stores act(gate) * up, as the product (same config) and then
    silu_and_mul over its column pairs would; N = 80 pairs' columns (ragged tiles), with bias."""
    x, packed, b = int4_case(1, 80, 384, 64, dtype, True, seed=5)
    plain = int4_matmul(x, *packed, b, config)
    got = int4_matmul(x, *packed, b, config, epilogue=2 if gelu else 1)
    assert got.shape == (1, 40)
    torch.testing.assert_close(got, act_of_pairs(plain, gelu), rtol=2 * UNIT[dtype], atol=1e-6)
    assert split_k_counters(DEVICE).count_nonzero() == 0


@gpu_only
def test_llama_8b_gate_up_activation_epilogue():
    """The 8B gate_up (28672 x 4096) at one row on its default config (packed float16 since s42) and on the
    float32 GEMV: the epilogue equals the product followed by silu_and_mul over its pairs."""
    from graphllm.kernels.int4_matmul import fuses_activation
    n, k = 28672, 4096
    packed = quantize_int4_weight((gpu_randn((n, k)) / k ** 0.5).to(torch.bfloat16), 128)
    assert fuses_activation(1, n, k, 128, DEVICE)
    x = randn((1, k), torch.bfloat16, 11)
    for config in (None, {"BLOCK_M": 1, "BLOCK_N": 128, "BLOCK_K": 128, "num_warps": 4, "num_stages": 1,
                          "SPLIT_K": 8, "GEMV": True}):
        plain = int4_matmul(x, *packed, None, config)
        got = int4_matmul(x, *packed, None, config, epilogue=1)
        torch.testing.assert_close(got, act_of_pairs(plain, False), rtol=2 * UNIT[torch.bfloat16], atol=1e-6)
    assert split_k_counters(DEVICE).count_nonzero() == 0


@pytest.mark.parametrize("unit_offset", (False, True))
@pytest.mark.parametrize("m, config", [(1, tiles(BLOCK_M=1, BLOCK_K=32, GEMV=True, SPLIT_K=3)),
                                       (1, tiles(BLOCK_M=1, BLOCK_N=64, BLOCK_K=32, GEMV=True, F16=4)),
                                       (3, tiles(BLOCK_M=16, BLOCK_K=32, SPLIT_K=2)),
                                       (5, tiles(BLOCK_M=16, BLOCK_K=64, SWAP_AB=True, PAIRS=True))])
def test_add_norm_finish_and_the_next_products_rstd(m, config, unit_offset):
    """int4_matmul_add_norm: the product (same config), + residual, * w (1 + w), 16-column sums of squares of h, in
    one launch; then int4_matmul(xn, rstd=...) equals the next product of the norm's output within its roundings."""
    from graphllm.kernels.int4_matmul import int4_matmul_add_norm
    from graphllm.kernels.reference import reference_rms_norm
    x, packed, b = int4_case(m, 96, 384, 64, LOW_DTYPE, True, seed=6)
    residual, w_norm = randn((m, 96), LOW_DTYPE, 7), randn((96,), LOW_DTYPE, 8)
    xn, h, sumsq = int4_matmul_add_norm(x, *packed, b, residual, w_norm, unit_offset, config)
    want_h = int4_matmul(x, *packed, b, config) + residual
    assert torch.equal(h, want_h)
    w = w_norm.float() + 1.0 if unit_offset else w_norm.float()
    assert torch.equal(xn, (want_h.float() * w).to(LOW_DTYPE))
    torch.testing.assert_close(sumsq, (want_h.float() ** 2).reshape(m, 6, 16).sum(-1), rtol=1e-5, atol=1e-5)
    assert split_k_counters(DEVICE).count_nonzero() == 0
    # the next linear, [80, 96] in groups of 32, on the same kind of tile
    _, packed2, b2 = int4_case(m, 80, 96, 32, LOW_DTYPE, True, seed=9)
    normed = reference_rms_norm(h, w_norm, 1e-5, unit_offset)
    got = int4_matmul(xn, *packed2, b2, dict(config, BLOCK_K=32), rstd=(sumsq, 1e-5))
    want = int4_linear_reference(normed, *packed2, b2)
    mag = normed.float().abs() @ dequantize_int4(*packed2).abs().t()
    excess = ((got.float() - want.float()).abs() - 4 * UNIT[LOW_DTYPE] * (want.float().abs() + mag)).max().item()
    assert excess <= 0, f"beyond two roundings of the operand by {excess}"
    assert split_k_counters(DEVICE).count_nonzero() == 0


def test_rstd_with_the_activation_epilogue():
    """gate_up's GEMV with both folds: its sums scaled by 1 / rms, then SwiGLU over the column pairs."""
    config = tiles(BLOCK_M=1, BLOCK_K=32, GEMV=True, SPLIT_K=2)
    x, packed, b = int4_case(1, 80, 96, 32, LOW_DTYPE, True, seed=10)
    sumsq = (x.float() ** 2).reshape(1, 6, 16).sum(-1) * 4.0  # the row's rms: 2 rms(x)
    plain = int4_matmul(x, *packed, b, config, rstd=(sumsq, 0.0))
    got = int4_matmul(x, *packed, b, config, epilogue=1, rstd=(sumsq, 0.0))
    torch.testing.assert_close(got, act_of_pairs(plain, False), rtol=2 * UNIT[LOW_DTYPE], atol=1e-6)
    unscaled = int4_matmul(x, *packed, None, config)
    torch.testing.assert_close(plain.float(), (unscaled.float() / (2 * x.float().pow(2).mean().sqrt()) + b.float()),
                               rtol=4 * UNIT[LOW_DTYPE], atol=1e-2)
    assert split_k_counters(DEVICE).count_nonzero() == 0
