"""skinny_matmul equals x @ W^T (+ bias) computed in float32, for every tile path, K split and ragged edge;
its prologues (rms_norm, add_rms_norm, silu_mul) equal the eager ops followed by that product, and its
epilogue (matmul_act_mul) the product followed by silu_and_mul."""

import pytest
import torch

pytest.importorskip("triton")

from graphllm.kernels.skinny_matmul import (  # noqa: E402
    CONFIGS, INTERLEAVED_CONFIGS, MAX_ROWS, _counters, beats_cublas, default_config, epilogue_config, fuses_activation,
    interleave_gate_up, interleaved_config, matmul_act_mul,
    rms_norm_matmul, rms_norm_matmul_normed, rms_norm_matmul_reference, row_sumsq_matmul, row_sumsq_reference, silu_mul_matmul,
    silu_mul_matmul_reference, skinny_matmul, skinny_matmul_reference, takes_row_sumsq)
from graphllm.kernels.rms_norm import rms_norm_reference  # noqa: E402
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


def tiles(split_k: int) -> dict:
    return {"BLOCK_N": 32, "BLOCK_K": 32, "SPLIT_K": split_k, "num_warps": 4, "num_stages": 2}


@pytest.mark.parametrize("split_k", (2, 3, 5))
@pytest.mark.parametrize("m, dtype", [(1, torch.float32), (3, LOW_DTYPE), (MAX_ROWS, torch.float32)])
def test_split_k_sums_every_split_once(m, dtype, split_k):
    """K = 200 in 32-column steps: splits of unequal length, the last one ragged; counters left at zero."""
    check(m, 80, 200, dtype, bias=True, config=tiles(split_k))
    check(m, 48, 96, dtype, bias=False, config=tiles(split_k), seed=3)
    assert _counters(DEVICE).count_nonzero() == 0


@pytest.mark.parametrize("split_k", (1, 3))
@pytest.mark.parametrize("m, dtype", [(1, torch.float32), (4, torch.float32), (1, LOW_DTYPE), (MAX_ROWS, LOW_DTYPE)])
@pytest.mark.parametrize("residual", (False, True))
def test_rms_norm_prologue(m, dtype, residual, split_k):
    x, r = randn((m, 200), dtype, 0), randn((m, 200), dtype, 1) if residual else None
    norm_w, w = 1 + randn((200,), dtype, 2) / 4, randn((80, 200), dtype, 3) / 200 ** 0.5
    b = randn((80,), dtype, 4)
    got, h = rms_norm_matmul(x, norm_w, 1e-5, w, b, residual=r, config=tiles(split_k))
    want, want_h = rms_norm_matmul_reference(x, norm_w, 1e-5, w, b, residual=r)
    assert_close(got, want)
    assert (h is None and want_h is None) if r is None else torch.equal(h, want_h)  # the residual add rounds once


@pytest.mark.parametrize("split_k", (1, 3))
@pytest.mark.parametrize("m, dtype", [(1, torch.float32), (1, LOW_DTYPE), (5, LOW_DTYPE)])
@pytest.mark.parametrize("residual, unit_offset", [(False, False), (True, False), (True, True)])
def test_norm_prologue_stores_the_norms_output(m, dtype, residual, unit_offset, split_k):
    """rms_norm_matmul_normed: the product and h of rms_norm_matmul, bit for bit, and y, the operand the product
    used (the plain product over y with the same tiles is the same result, exactly), within rounding of the norm's
    reference; 3 column tiles and 3 K splits: only the first tile's programs store it, every K split its columns."""
    x, r = randn((m, 200), dtype, 0), randn((m, 200), dtype, 1) if residual else None
    norm_w, w = 1 + randn((200,), dtype, 2) / 4, randn((80, 200), dtype, 3) / 200 ** 0.5
    b = randn((80,), dtype, 4)
    got, h, y = rms_norm_matmul_normed(x, norm_w, 1e-5, w, b, residual=r, config=tiles(split_k),
                                       unit_offset=unit_offset)
    plain, plain_h = rms_norm_matmul(x, norm_w, 1e-5, w, b, residual=r, config=tiles(split_k),
                                     unit_offset=unit_offset)
    assert torch.equal(got, plain) and (h is None if r is None else torch.equal(h, plain_h))
    assert y.shape == x.shape and y.dtype == x.dtype and y.is_contiguous()
    assert torch.equal(skinny_matmul(y, w, b, config=tiles(split_k)), got)
    assert_close(y, rms_norm_reference(x, norm_w, 1e-5, r, unit_offset)[0])


@pytest.mark.parametrize("m, dtype", [(1, torch.float32), (1, LOW_DTYPE), (MAX_ROWS, LOW_DTYPE)])
def test_gelu_mul_prologue(m, dtype):
    """Gemma's GeGLU before down_proj: gelu(gate, approximate="tanh") * up in the prologue."""
    from graphllm.kernels.skinny_matmul import gelu_mul_matmul_reference
    x, w = randn((m, 2 * 200), dtype, 0) * 3, randn((80, 200), dtype, 1) / 200 ** 0.5
    got = silu_mul_matmul(x, w, gelu=True)
    assert_close(got, gelu_mul_matmul_reference(x, w))
    assert not torch.allclose(got.float(), silu_mul_matmul_reference(x, w).float(), atol=1e-2)


@pytest.mark.parametrize("m, dtype", [(1, torch.float32), (1, LOW_DTYPE), (MAX_ROWS, LOW_DTYPE)])
@pytest.mark.parametrize("residual", (False, True))
def test_rms_norm_prologue_with_unit_offset(m, dtype, residual):
    """Gemma's norm in the prologue: scaled by 1 + norm_weight in float32 (the weight itself near 0)."""
    x, r = randn((m, 200), dtype, 0), randn((m, 200), dtype, 1) if residual else None
    norm_w, w = randn((200,), dtype, 2) / 4, randn((80, 200), dtype, 3) / 200 ** 0.5
    got, h = rms_norm_matmul(x, norm_w, 1e-6, w, residual=r, unit_offset=True)
    want, want_h = rms_norm_matmul_reference(x, norm_w, 1e-6, w, residual=r, unit_offset=True)
    assert_close(got, want)
    assert (h is None) if r is None else torch.equal(h, want_h)
    plain, _ = rms_norm_matmul_reference(x, norm_w, 1e-6, w, residual=r)
    assert not torch.allclose(got.float(), plain.float(), atol=1e-2)  # the offset changes the result


@pytest.mark.parametrize("split_k", (1, 2))
@pytest.mark.parametrize("m, dtype", [(1, torch.float32), (5, torch.float32), (1, LOW_DTYPE), (MAX_ROWS, LOW_DTYPE)])
def test_silu_mul_prologue(m, dtype, split_k):
    wide = randn((m, 2 * 96 + 16), dtype, 0)
    x = wide[:, 8:8 + 2 * 96]  # strided rows: [gate | up] inside a wider tensor
    w = randn((48, 96), dtype, 1) / 96 ** 0.5
    assert_close(silu_mul_matmul(x, w, config=tiles(split_k)), silu_mul_matmul_reference(x, w))


@pytest.mark.parametrize("gelu", (False, True))
@pytest.mark.parametrize("m, split_k", [(5, 1), (8, 2)])
def test_act_prologue_is_the_two_launches(m, split_k, gelu):
    """At 2-8 rows the prologue gives what silu_and_mul's row kernel before the same product gives: the same
    operand tiles, so the same bits (the engine takes it at one row only: fuses_activation)."""
    from graphllm.kernels.silu_and_mul import silu_and_mul
    x, w = randn((m, 2 * 96), LOW_DTYPE, 0) * 2, randn((48, 96), LOW_DTYPE, 1) / 96 ** 0.5
    config = tiles(split_k)
    assert torch.equal(silu_mul_matmul(x, w, config=config, gelu=gelu),
                       skinny_matmul(silu_and_mul(x, gelu=gelu), w, config=config))


def test_activation_folds_where_the_product_takes_the_kernel():
    assert fuses_activation(1, 4096, 14336) and fuses_activation(1, 3072, 8192)  # every one-row down_proj
    # not the 8B down at 2-8 rows: batch 8 measured 18% slower that way (H100, 2026-12-06)
    assert not any(fuses_activation(m, 4096, 14336) for m in (2, 4, 8, 16))
    assert not fuses_activation(8, 3072, 8192)  # Phi-3-mini's down at 8 rows runs cuBLAS, after silu_and_mul


@pytest.mark.parametrize("act", ("none", "silu", "gelu"))
@pytest.mark.parametrize("m, dtype, split_k", [(1, LOW_DTYPE, 1), (1, torch.float32, 4), (2, LOW_DTYPE, 1),
                                              (5, torch.float32, 2), (8, LOW_DTYPE, 3)])
def test_row_sumsq_epilogue(m, dtype, split_k, act):
    """The product is skinny_matmul's (or silu_mul_matmul's) to the bit, and sumsq holds the 16-column sums of
    (y + residual)^2 with the sum rounded as the norm's add rounds it. N = 80: the last 32-column tile is half
    past N (its second group is not stored)."""
    k = 96
    x = randn((m, 2 * k if act != "none" else k), dtype, 0) * 2
    w, b = randn((80, k), dtype, 1) / k ** 0.5, randn((80,), dtype, 2)
    r = randn((m, 80), dtype, 3) * 4
    y, sumsq = row_sumsq_matmul(x, w, r, b, config=tiles(split_k), act=act)
    plain = (skinny_matmul(x, w, b, config=tiles(split_k)) if act == "none"
             else silu_mul_matmul(x, w, b, config=tiles(split_k), gelu=act == "gelu"))
    assert torch.equal(y, plain)
    assert sumsq.shape == (m, 5) and sumsq.dtype == torch.float32
    torch.testing.assert_close(sumsq, row_sumsq_reference(y, r), rtol=1e-6, atol=0)
    assert not torch.allclose(sumsq, row_sumsq_reference(y, torch.zeros_like(r)), rtol=1e-2)  # the residual counts
    assert _counters(DEVICE).count_nonzero() == 0


@pytest.mark.parametrize("unit_offset", (False, True))
@pytest.mark.parametrize("m, dtype, split_k", [(1, LOW_DTYPE, 1), (1, torch.float32, 2), (2, LOW_DTYPE, 1),
                                              (4, torch.float32, 1), (8, LOW_DTYPE, 2)])
def test_norm_prologue_from_row_sumsq(m, dtype, split_k, unit_offset):
    """o_proj then gate_up at 1-8 rows: the second product normalises h = y + residual with the first one's
    statistics instead of reading the rows whole, and gives the norm-then-product result (h to the bit; the
    product within the dtype's tolerance: the mean square is summed in another order); wrong statistics would
    show."""
    k = 160
    a, r = randn((m, 64), dtype, 0), randn((m, k), dtype, 1) * 3
    w_o = randn((k, 64), dtype, 2) / 8
    norm_w, w_up = 1 + randn((k,), dtype, 3) / 4, randn((96, k), dtype, 4) / k ** 0.5
    y, sumsq = row_sumsq_matmul(a, w_o, r, config=tiles(1))
    got, h = rms_norm_matmul(y, norm_w, 1e-5, w_up, residual=r, config=tiles(split_k), unit_offset=unit_offset,
                             sumsq=sumsq)
    want, want_h = rms_norm_matmul_reference(y, norm_w, 1e-5, w_up, residual=r, unit_offset=unit_offset)
    assert torch.equal(h, want_h)
    assert_close(got, want)
    same, _ = rms_norm_matmul(y, norm_w, 1e-5, w_up, residual=r, config=tiles(split_k), unit_offset=unit_offset)
    assert_close(got, same)
    off, _ = rms_norm_matmul(y, norm_w, 1e-5, w_up, residual=r, config=tiles(split_k), unit_offset=unit_offset,
                             sumsq=sumsq * 4)
    assert not torch.allclose(off.float(), want.float(), atol=1e-2)


def test_row_sumsq_takes_the_pairs_that_run_the_kernel():
    """Llama-3-8B at one row and the buckets 2, 4, 8: o_proj -> gate_up and down -> the next qkv (at one row the
    second product is the fused one-row launch whatever its shape); not 16 rows (cuBLAS), not a pair with a
    product on cuBLAS (Phi-3-mini's down and qkv at 8 rows)."""
    o_proj, gate_up, down, qkv = (4096, 4096), (28672, 4096), (4096, 14336), (6144, 4096)
    for m in (1, 2, 4, 8):
        assert takes_row_sumsq(m, o_proj, gate_up) and takes_row_sumsq(m, down, qkv)
    assert not any(takes_row_sumsq(m, o_proj, gate_up) or takes_row_sumsq(m, down, qkv) for m in (9, 16))
    assert not takes_row_sumsq(1, (14336, 4096), (4096, 14336))  # a first product on cuBLAS at one row
    assert takes_row_sumsq(3, o_proj, gate_up) and not takes_row_sumsq(3, down, qkv)  # qkv at 3 rows: cuBLAS
    assert takes_row_sumsq(8, (3072, 3072), (16384, 3072))  # Phi-3-mini's o_proj -> gate_up
    assert not takes_row_sumsq(8, (3072, 8192), (9216, 3072))
    assert not takes_row_sumsq(8, o_proj, (6144, 2048))  # the second product must read the first one's columns


def act_mul_tiles(block_n: int) -> dict:
    return {"BLOCK_N": block_n, "BLOCK_K": 64, "SPLIT_K": 1, "num_warps": 4, "num_stages": 2}


@pytest.mark.parametrize("gelu", (False, True))
@pytest.mark.parametrize("m, dtype", [(1, torch.float32), (1, LOW_DTYPE), (4, LOW_DTYPE), (MAX_ROWS, torch.float32)])
@pytest.mark.parametrize("n, k, bias", [(64, 128, False), (40, 200, True)])
def test_act_mul_epilogue_is_the_two_ops(m, dtype, n, k, bias, gelu):
    """matmul_act_mul over [gate; up] gives the plain product's gate and up halves (the same tiles: the same sums)
    through graphllm's silu_and_mul row kernel, exactly (the two launches it replaces on the GPU); against the
    float32 product and the eager activation within the dtype's tolerance. (40, 200): N not a multiple of the
    tile, K not of the K step."""
    from graphllm.kernels.reference import reference_gelu_tanh_and_mul, reference_silu_and_mul
    from graphllm.kernels.silu_and_mul import silu_and_mul
    eager = reference_gelu_tanh_and_mul if gelu else reference_silu_and_mul
    x = randn((m, k), dtype, 0) * 2
    w = randn((2 * n, k), dtype, 1) / k ** 0.5
    b = randn((2 * n,), dtype, 2) if bias else None
    got, h = matmul_act_mul(x, w, b, config=act_mul_tiles(16), gelu=gelu)
    assert h is None and got.shape == (m, n) and got.is_contiguous()
    plain = skinny_matmul(x, w, b, config={**act_mul_tiles(16), "BLOCK_N": 16})
    assert torch.equal(got, silu_and_mul(plain, gelu=gelu))
    assert_close(got, eager(skinny_matmul_reference(x, w, b)))


@pytest.mark.parametrize("gelu", (False, True))
@pytest.mark.parametrize("m, dtype", [(1, torch.float32), (1, LOW_DTYPE), (5, LOW_DTYPE), (MAX_ROWS, torch.float32)])
@pytest.mark.parametrize("n, k, bias", [(64, 128, False), (40, 200, True)])
def test_interleaved_act_mul_epilogue_is_the_two_ops(m, dtype, n, k, bias, gelu):
    """Over interleave_gate_up's weight and bias, one tile of rows holds both halves: the same result as the
    plain product over that weight (the same tiles: the same sums), its columns put back as [gate; up], through
    silu_and_mul's row kernel, exactly; the eager ops over [gate; up] within tolerance; with a norm prologue too.
    (40, 200): ragged N and K."""
    from graphllm.kernels.reference import reference_gelu_tanh_and_mul, reference_silu_and_mul
    from graphllm.kernels.silu_and_mul import silu_and_mul
    eager = reference_gelu_tanh_and_mul if gelu else reference_silu_and_mul
    x = randn((m, k), dtype, 0) * 2
    w = randn((2 * n, k), dtype, 1) / k ** 0.5
    b = randn((2 * n,), dtype, 2) if bias else None
    w_il, b_il = interleave_gate_up(w), None if b is None else interleave_gate_up(b)
    assert torch.equal(w_il[0::2], w[:n]) and torch.equal(w_il[1::2], w[n:])
    got, h = matmul_act_mul(x, w_il, b_il, config=act_mul_tiles(32), gelu=gelu, interleaved=True)
    assert h is None and got.shape == (m, n) and got.is_contiguous()
    halves = lambda y: torch.cat((y[:, 0::2], y[:, 1::2]), dim=1)  # noqa: E731
    plain = skinny_matmul(x, w_il, b_il, config=act_mul_tiles(32))
    assert torch.equal(got, silu_and_mul(halves(plain), gelu=gelu))
    assert_close(got, eager(skinny_matmul_reference(x, w, b)))
    norm_w, r = 1 + randn((k,), dtype, 3) / 4, randn((m, k), dtype, 4)
    got, h = matmul_act_mul(x, w_il, b_il, config=act_mul_tiles(32), gelu=gelu, residual=r, norm_weight=norm_w,
                            eps=1e-5, interleaved=True)
    plain, want_h = rms_norm_matmul(x, norm_w, 1e-5, w_il, b_il, residual=r, config=act_mul_tiles(32))
    assert torch.equal(got, silu_and_mul(halves(plain), gelu=gelu)) and torch.equal(h, want_h)


def test_measured_interleaved_shapes_take_their_configs():
    """INTERLEAVED_CONFIGS' entries win over the rule (only there: other rows keep it), and each distinct tile
    computes the two ops over an interleaved weight of one tile's width and two K steps."""
    from graphllm.kernels.silu_and_mul import silu_and_mul
    for (m, n, k), config in INTERLEAVED_CONFIGS.items():
        assert interleaved_config(m, n, k, DEVICE) == config
    assert interleaved_config(16, 28672, 4096, DEVICE) == {**default_config(16, 28672, 4096, DEVICE), "SPLIT_K": 1}
    for config in {tuple(sorted(c.items())): c for c in INTERLEAVED_CONFIGS.values()}.values():
        n, k = config["BLOCK_N"], 2 * config["BLOCK_K"]
        x, w = randn((3, k), LOW_DTYPE, 0), randn((n, k), LOW_DTYPE, 1) / k ** 0.5
        got, _ = matmul_act_mul(x, w, config=config, interleaved=True)
        plain = skinny_matmul(x, w, config=config)
        assert torch.equal(got, silu_and_mul(torch.cat((plain[:, 0::2], plain[:, 1::2]), dim=1)))


@pytest.mark.parametrize("m, dtype", [(1, torch.float32), (1, LOW_DTYPE), (MAX_ROWS, LOW_DTYPE)])
@pytest.mark.parametrize("residual", (False, True))
def test_act_mul_epilogue_after_a_norm_prologue(m, dtype, residual):
    """The batch-1 gate_up: add_rms_norm (or rms_norm) in, SwiGLU out, one launch; h as rms_norm_matmul gives it."""
    from graphllm.kernels.reference import reference_silu_and_mul
    from graphllm.kernels.silu_and_mul import silu_and_mul
    x, r = randn((m, 192), dtype, 0), randn((m, 192), dtype, 1) if residual else None
    norm_w, w = 1 + randn((192,), dtype, 2) / 4, randn((96, 192), dtype, 3) / 192 ** 0.5
    got, h = matmul_act_mul(x, w, residual=r, norm_weight=norm_w, eps=1e-5, config=act_mul_tiles(16))
    plain, want_h = rms_norm_matmul(x, norm_w, 1e-5, w, residual=r, config=act_mul_tiles(16))
    assert torch.equal(got, silu_and_mul(plain))
    assert (h is None and want_h is None) if r is None else torch.equal(h, want_h)
    want, _ = rms_norm_matmul_reference(x, norm_w, 1e-5, w, residual=r)
    assert_close(got, reference_silu_and_mul(want))


def test_epilogue_config_halves_the_tile():
    """Half the plain product's columns from each half of the weight: the same bytes per program; no K split."""
    for m, n, k in [(1, 28672, 4096), (8, 28672, 4096), (1, 16384, 3072), (8, 96, 64)]:
        plain, fused = default_config(m, n, k, DEVICE), epilogue_config(m, n, k, DEVICE)
        assert fused["BLOCK_N"] == max(8 if m == 1 else 16, plain["BLOCK_N"] // 2) and fused["SPLIT_K"] == 1
        assert {key: v for key, v in fused.items() if key not in ("BLOCK_N", "SPLIT_K")} == {
            key: v for key, v in plain.items() if key not in ("BLOCK_N", "SPLIT_K")}


@pytest.mark.parametrize("m", (1, 8))
def test_default_config_paths(m):
    check(m, 96, 160, LOW_DTYPE, bias=True)


def test_measured_shapes_take_their_configs():
    """CONFIGS' one-row entries win over the rule and route to the kernel (measured faster than cuBLAS), and
    their tiles (Gemma 2's 32 x 512 with a norm prologue, 16 x 512) compute the reference on a small weight."""
    for (m, n, k), config in CONFIGS.items():
        assert default_config(m, n, k, DEVICE) == config and beats_cublas(m, n, k)
    assert not beats_cublas(1, 12288, 4096 * 2) and not beats_cublas(1, 32064, 4096)  # near them: the rule
    x, residual = randn((1, 1024), LOW_DTYPE, 3), randn((1, 1024), LOW_DTYPE, 4)
    norm_w = 1 + randn((1024,), LOW_DTYPE, 5) / 4
    w = randn((64, 1024), LOW_DTYPE, 6) / 32
    got, h = rms_norm_matmul(x, norm_w, 1e-6, w, residual=residual, config=CONFIGS[(1, 8192, 3584)])
    want, want_h = rms_norm_matmul_reference(x, norm_w, 1e-6, w, residual=residual)
    assert_close(got, want)
    assert torch.equal(h, want_h)
    assert_close(skinny_matmul(x, w, config=CONFIGS[(1, 3584, 4096)]), skinny_matmul_reference(x, w))
    # Qwen3-MoE's router at its shape: 8 K splits of one 256-column step each
    x, w = randn((1, 2048), LOW_DTYPE, 7), randn((128, 2048), LOW_DTYPE, 8) / 45
    assert_close(skinny_matmul(x, w, config=CONFIGS[(1, 128, 2048)]), skinny_matmul_reference(x, w))


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
    assert default_config(8, 1 << 20, 4096, DEVICE)["BLOCK_N"] == 64
    assert default_config(1, 1 << 20, 4096, DEVICE)["BLOCK_N"] == 16
    assert default_config(1, 6144, 4096, DEVICE)["BLOCK_N"] == 16
    assert default_config(8, 64, 4096, DEVICE)["BLOCK_N"] == 32
    assert default_config(8, 28672, 4096, DEVICE)["BLOCK_N"] == 64  # gate_up at 8 rows
    assert default_config(1, 64, 48, DEVICE)["BLOCK_K"] == 64
    assert default_config(1, 64, 48, DEVICE)["SPLIT_K"] == 1  # too short to split
    down = default_config(1, 4096, 14336, DEVICE)  # K >= 2N at one row: wider tiles, 4 K splits
    assert (down["BLOCK_N"], down["SPLIT_K"]) == (32, 4)
    assert default_config(1, 4096, 2048, DEVICE)["SPLIT_K"] == 1 and default_config(8, 4096, 16384, DEVICE)["SPLIT_K"] == 1
    assert default_config(1, 64, 8 * 256, DEVICE)["SPLIT_K"] == 2  # never fewer than four K steps per split
    assert beats_cublas(1, 6144, 4096) and beats_cublas(16, 128256, 4096)
    assert not beats_cublas(8, 6144, 3072) and not beats_cublas(1, 28672, 4096)
    assert beats_cublas(8, 6144, 4096) and beats_cublas(2, 4096, 14336)  # 8B qkv and down at 2-8 rows: CONFIGS
    assert not beats_cublas(16, 6144, 4096) and not beats_cublas(3, 4096, 14336)  # not buckets they were given
    assert beats_cublas(8, 4096, 4096) and beats_cublas(2, 28672, 4096)  # o_proj, gate_up at 2-8 rows
    assert not beats_cublas(8, 4096, 16384) and not beats_cublas(9, 4096, 4096)  # K >= 2N; o_proj past 8 rows
    assert not beats_cublas(17, 128256, 4096)


@gpu_only
@pytest.mark.parametrize("m", (1, 2, 8, 16))
@pytest.mark.parametrize("n, k", [(6144, 4096), (4096, 4096), (4096, 14336), (28672, 4096), (128256, 4096)])
def test_llama_8b_shapes(m, n, k):
    check(m, n, k, torch.bfloat16, bias=False)
    x = randn((m, k), torch.bfloat16, 7)
    norm_w, w = 1 + randn((k,), torch.bfloat16, 8) / 4, randn((n, k), torch.bfloat16, 9) / k ** 0.5
    got, h = rms_norm_matmul(x, norm_w, 1e-5, w, residual=x)
    want, want_h = rms_norm_matmul_reference(x, norm_w, 1e-5, w, residual=x)
    assert_close(got, want)
    assert torch.equal(h, want_h)
    gate_up = randn((m, 2 * k), torch.bfloat16, 10)
    assert_close(silu_mul_matmul(gate_up, w), silu_mul_matmul_reference(gate_up, w))
    if m > 1:  # the prologue at several rows is the two launches' result (the engine runs it at one row only)
        from graphllm.kernels.silu_and_mul import silu_and_mul
        assert torch.equal(silu_mul_matmul(gate_up, w), skinny_matmul(silu_and_mul(gate_up), w))
    assert _counters(gate_up.device).count_nonzero() == 0


@gpu_only
@pytest.mark.parametrize("m", (1, 2, 8))
@pytest.mark.parametrize("n, k", [(28672, 4096), (16384, 3072), (22016, 4096)])  # 8B, Phi-3-mini, OLMo 2 gate_up
def test_act_mul_epilogue_at_gate_up_shapes(m, n, k):
    """The engine's launches (epilogue_config): against the plain product's tiles and silu_and_mul's row kernel,
    the two launches linear_epilogue replaces, and against float32; at one row with the norm prologue too."""
    from graphllm.kernels.reference import reference_silu_and_mul
    from graphllm.kernels.silu_and_mul import silu_and_mul
    x = randn((m, k), torch.bfloat16, 11)
    w = randn((n, k), torch.bfloat16, 12) / k ** 0.5
    config = epilogue_config(m, n, k, x.device)
    got, _ = matmul_act_mul(x, w)
    assert torch.equal(got, silu_and_mul(skinny_matmul(x, w, config=config)))
    assert_close(got, reference_silu_and_mul(skinny_matmul_reference(x, w)))
    if m == 1:
        norm_w = 1 + randn((k,), torch.bfloat16, 13) / 4
        got, h = matmul_act_mul(x, w, residual=x, norm_weight=norm_w, eps=1e-5)
        want, want_h = rms_norm_matmul_reference(x, norm_w, 1e-5, w, residual=x)
        assert_close(got, reference_silu_and_mul(want))
        assert torch.equal(h, want_h)
