"""int4_mma: the MMA layout of an int4 weight, checked lane by lane against PTX's fragment tables on the CPU, and the
tensor-core kernel against the int4 reference on an sm_90 GPU."""

import pytest
import torch
import triton
import triton.language as tl

from graphllm.kernels import int4_mma
from graphllm.kernels.int4_mma import mma_reference, shuffle_int4_mma, unshuffle_int4_mma
from graphllm.kernels.quant_layout import int4_linear_reference, quantize_int4_weight

SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)


def quantized(n: int, k: int, group: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    qweight, scales, zeros = quantize_int4_weight(torch.randn(n, k, generator=gen), group)
    return qweight, scales, zeros, torch.randn(n, generator=gen)


@pytest.mark.parametrize("n, k", [(16, 128), (48, 512), (64, 256)])
def test_the_layout_round_trips_every_nibble(n, k):
    """Every nibble value at every position (words with the sign bit set among them) comes back where it was."""
    gen = torch.Generator().manual_seed(n + k)
    qweight = torch.randint(-2**31, 2**31 - 1, (k // 8, n), generator=gen, dtype=torch.int64).to(torch.int32)
    words = shuffle_int4_mma(qweight)
    assert words.shape == (n // 16, k // 128, 32, 8)
    assert torch.equal(unshuffle_int4_mma(words), qweight)
    assert not torch.equal(words.flatten(), qweight.t().flatten())  # a layout of its own, not a transpose


def test_the_layout_refuses_shapes_it_cannot_tile():
    with pytest.raises(AssertionError, match="multiple of 16"):
        shuffle_int4_mma(torch.zeros(16, 24, dtype=torch.int32))
    with pytest.raises(AssertionError, match="multiple of 16"):
        shuffle_int4_mma(torch.zeros(12, 32, dtype=torch.int32))  # K = 96


@pytest.mark.parametrize("m, group", [(1, 128), (3, 256), (8, 128), (13, 128), (16, 256)])
def test_the_lanes_compute_the_linear(m, group):
    """mma_reference builds each lane's A and B registers as the kernel does (B from x's rows 0-7, then 8-15) and
    places them by PTX's fragment tables: the product is the int4 linear's, up to float32 rounding."""
    n, k = 48, 512
    qweight, scales, zeros, bias = quantized(n, k, group)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(1))
    got = mma_reference(x, shuffle_int4_mma(qweight), scales, zeros, bias)
    torch.testing.assert_close(got, int4_linear_reference(x, qweight, scales, zeros, bias), rtol=1e-5, atol=1e-4)


def test_a_wrong_nibble_table_is_caught(monkeypatch):
    """Swapping two nibbles' places in the layout (columns n and n + 8 of one K offset) changes the product: the
    check above would see a fragment table transcribed wrong."""
    qweight, scales, zeros, _ = quantized(32, 256, 128)
    x = torch.randn(1, 256, generator=torch.Generator().manual_seed(2))
    want = int4_linear_reference(x, qweight, scales, zeros)
    table = list(int4_mma.NIBBLES)
    table[0], table[1] = table[1], table[0]
    monkeypatch.setattr(int4_mma, "NIBBLES", tuple(table))
    words = shuffle_int4_mma(qweight)
    monkeypatch.undo()
    assert not torch.allclose(mma_reference(x, words, scales, zeros), want, rtol=1e-3, atol=1e-2)


@triton.jit
def _tile_kernel(y_ptr, out_ptr, WARPS: tl.constexpr):
    e = tl.arange(0, 32 * WARPS)
    y0, y1, y2, y3 = (tl.load(y_ptr + i * 32 * WARPS + e) for i in range(4))
    tile = int4_mma.fragments_to_tile(y0, y1, y2, y3, WARPS)
    rows, cols = tl.arange(0, 8), tl.arange(0, 16 * WARPS)
    tl.store(out_ptr + rows[:, None] * 16 * WARPS + cols[None, :], tile)


@pytest.mark.parametrize("warps", [4, 8])
def test_the_fragments_land_in_their_rows_and_columns(warps):
    """The kernel's last step places D's registers: value 1000 i + e (register i of thread e) must land at row 2t +
    (i odd), column 16 w + g + 8 (i >= 2), as PTX's C fragment table says (Triton's interpreter on a CPU)."""
    e = torch.arange(32 * warps)
    y = torch.stack([1000 * i + e for i in range(4)]).float()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    out = torch.full((8, 16 * warps), -1.0, device=device)
    _tile_kernel[(1,)](y.to(device), out, WARPS=warps, num_warps=warps)
    want = torch.full((8, 16 * warps), -1.0)
    lane, warp = e % 32, e // 32
    for i in range(4):
        want[2 * (lane % 4) + i % 2, 16 * warp + lane // 4 + 8 * (i // 2)] = y[i]
    assert torch.equal(out.cpu(), want)


@pytest.mark.skipif(not SM90, reason="needs an sm_90 GPU (mma.sync with sub.rn.bf16x2)")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m", [1, 3, 8, 9, 16])
@pytest.mark.parametrize("xsum, warps, split_k, group", [(True, 4, 8, 128), (False, 4, 8, 128), (True, 8, 1, 256),
                                                         (False, 8, 4, 512), (True, 4, 3, 128)])
def test_the_kernel_matches_the_reference(dtype, m, xsum, warps, split_k, group):
    from graphllm.kernels.int4_mma import int4_mma_matmul
    n, k = 256, 1024
    qweight, scales, zeros, bias = quantized(n, k, group, seed=m)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(3)).to(dtype).cuda()
    words = shuffle_int4_mma(qweight).cuda()
    s, z, b = (t.to(dtype).cuda() for t in (scales, zeros, bias))
    got = int4_mma_matmul(x, words, s, z, b, split_k=split_k, warps=warps, xsum=xsum)
    want = int4_linear_reference(x.float(), qweight.cuda(), s.float(), z.float(), b.float())
    bound = want.abs().max().item() * 2 ** -7  # the output's 16-bit rounding and float32 sums in another order
    assert (got.float() - want).abs().max().item() <= bound
    assert got.dtype == dtype and got.shape == (m, n)
    again = int4_mma_matmul(x, words, s, z, b, split_k=split_k, warps=warps, xsum=xsum)
    assert torch.equal(got, again)  # the split-K finish sums in split order: deterministic


@pytest.mark.skipif(not SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("m", [1, 16, 20])  # 20: past the kernel's rows, the dequantized weight and cuBLAS
def test_the_op_routes_rows_and_narrow_widths(m):
    """int4_mma_linear_rows at N = 48 (three 16-column tiles: fewer warps a program) and on both sides of 16 rows."""
    from graphllm.kernels.int4_mma import int4_mma_linear_rows
    qweight, scales, zeros, bias = quantized(48, 256, 128)
    x = torch.randn(m, 256, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16).cuda()
    s, z, b = (t.to(torch.bfloat16).cuda() for t in (scales, zeros, bias))
    got = int4_mma_linear_rows(x, shuffle_int4_mma(qweight).cuda(), s, z, b)
    want = int4_linear_reference(x.float(), qweight.cuda(), s.float(), z.float(), b.float())
    assert (got.float() - want).abs().max().item() <= want.abs().max().item() * 2 ** -7
