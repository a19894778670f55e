"""y = x @ W^T (+ bias) for 1..16 rows of a weight-only int4 linear on the tensor cores: one mma.sync per int32 word
and 8-row tile of x (--int4-mma, graphllm/passes/lowering/int4_mma_layout.py).

Opt-in and unmeasured (s44): the one-row GEMV of int4_matmul multiplies on the FP32 pipe at ~4 instructions a
weight (2.8 in packed float16), and s17's H200 counters and LOWBIT.md's tinygemm show int4 GEMVs issue- and
latency-bound, not bandwidth-bound (benchmarks/RESULTS.md, s44). Here the weight is the MMA's A operand
(mma.m16n8k16, 16 output columns x 16 K values) and 8 rows of x its B operand (9-16 rows: a second MMA on the
same A registers, XSUM only), so that each thread's
32-bit word IS its A fragment: eight nibbles, one shift and one LOP3 per pair of them (q | 0x4300 read as bfloat16
is 128 + q, 0x6400 float16 1024 + q), a packed subtraction of 128 + z (exact: q - z is a small integer), and one
HMMA for 256 weights of the warp, with no FP32 multiply-add. XSUM drops the subtraction: the MMA multiplies 128 + q,
a second MMA (A all ones) sums each row of x over the step, and each chunk takes (128 + z) * sum(x) away once.
Offline sm_90 SASS (Triton 3.6, 4 warps): the loop is 177 instructions for 64 weights a thread (2.77 a weight),
151-152 with XSUM (2.36-2.38), against the float32 GEMV's 3.99 and F16's 2.83 (benchmarks/RESULTS.md, s44): bfloat16's
7-bit mantissa holds one nibble a half, so each of a word's four pairs takes its own shift and LOP3.

The layout (shuffle_int4_mma, from GPTQ's [K/8, N] qweight): words[tile, chunk, lane, j] int32, one 16-column tile
of W by one 128-wide chunk of K by the 32 lanes of a warp by the 8 MMA steps of the chunk. Lane l (g = l // 4,
t = l % 4) of step j holds W's columns n = 16 tile + g (nibbles 0, 4, 2, 6) and n + 8 (nibbles 1, 5, 3, 7) at K
offsets 128 chunk + 32 t + 4 j + (0, 1, 2, 3): nibble pairs (0, 4), (1, 5), (2, 6), (3, 7) are PTX's A registers
a0a1, a2a3, a4a5, a6a7, whose fragment columns 2t, 2t + 1, 2t + 8, 2t + 9 stand for those K offsets. The K order
inside a chunk is free (a dot product), and this one gives each lane 4 contiguous x values a step: its B
registers b0b1 and b2b3 are one 8-byte load of row g (8 + g) of x (lanes of rows >= M load zeros). D's registers
then hold y[row 2t (+1), column n (+8)]; each chunk's sums are scaled by their columns' group scales in float32.
Past 16 rows, int4_mma_dequantize writes the dense weight from this layout for cuBLAS (int4_mma_linear_rows).

Where it rounds: (q - z) is exact in 16 bits, the MMA's products are exact in float32 and summed in float32 (in the
MMA's own order), then one float32 scale multiply-add per chunk and column: the reference up to float32 rounding.
XSUM sums (128 + q) x (float16: 1024 + q) and takes the offset's share away after the chunk: the float32 sums lose
7 (10) bits to the offset, relative to sum |x| s, still far below the output's 16-bit rounding.
Needs sm_90 (sub.rn.bf16x2) and 16-bit x; group sizes that are multiples of 128; N a multiple of 16, K of 128.
Triton's interpreter cannot run the PTX: CPU tests check the layout with mma_reference (the same lane arithmetic
in torch, PTX's fragment tables spelled out), the kernel itself is tested on the GPU.
"""

import torch
import triton
import triton.language as tl

from graphllm.kernels.gdc import dependent_start
from graphllm.kernels.launch import pdl_launch
from graphllm.kernels.quant_layout import INT4_PACK, unpack_int4
from graphllm.kernels.skinny_matmul import MAX_COLUMN_TILES, finish_tile, split_k_counters

CHUNK = 128  # K values per scale step (a group of 128, or a part of a larger group)
STEPS = CHUNK // 16  # mma.m16n8k16 steps a chunk
MAX_MMA_ROWS = 16  # rows of x a launch serves: one or two 8-row tiles (the MMA's N)
# nibble of a lane's word -> (W's column offset from 16 tile + g, K offset from 128 chunk + 32 t + 4 j)
NIBBLES = ((0, 0), (8, 0), (0, 2), (8, 2), (0, 1), (8, 1), (0, 3), (8, 3))

def mma_ptx(f16: bool, xsum: bool, tiles: int) -> str:
    """One word's inline PTX: a0a1 .. a6a7 from its nibble pairs ((w >> 4i) & 0x000F000F | MAGIC: MAGIC + q), less
    the lane's zero pairs (MAGIC + z of columns n and n + 8) unless xsum; then D += A B for each of `tiles` 8-row
    tiles of x (B: b0b1 b2b3, the 8 bytes of the lane's row); with xsum a second MMA per tile with A all ones sums
    each row of x over the step (D's rows 2t, 2t + 1), so that a chunk loses (MAGIC + z) * sum(x) once a column.
    Operands: the D registers (4 a tile, then 4 a tile of sums with xsum), then w, x per tile, the two zero pairs
    (not with xsum), then the accumulators in the D registers' order."""
    magic, t, one = ("0x64006400", "f16", "0x3C003C00") if f16 else ("0x43004300", "bf16", "0x3F803F80")
    outs = 4 * tiles * (2 if xsum else 1)
    w = f"${outs}"
    zeros = outs + 1 + tiles
    acc = zeros + (0 if xsum else 2)
    lines = [".reg .b32 a0, a1, a2, a3, s, " + ", ".join(f"b{i}" for i in range(2 * tiles)) + ";"]
    lines += [f"mov.b64 {{b{2 * i}, b{2 * i + 1}}}, ${outs + 1 + i};" for i in range(tiles)]
    lines.append(f"lop3.b32 a0, {w}, 0x000F000F, {magic}, 0xEA;")
    for r in (1, 2, 3):
        lines += [f"shr.u32 s, {w}, {4 * r};", f"lop3.b32 a{r}, s, 0x000F000F, {magic}, 0xEA;"]
    if not xsum:  # a0a1, a4a5: column n (row g of A); a2a3, a6a7: n + 8
        lines += [f"sub.rn.{t}x2 a{r}, a{r}, ${zeros + r % 2};" for r in range(4)]

    def mma(d: int, a: str, tile: int) -> str:
        return (f"mma.sync.aligned.m16n8k16.row.col.f32.{t}.{t}.f32 {{{', '.join(f'${d + j}' for j in range(4))}}}, "
                f"{{{a}}}, {{b{2 * tile}, b{2 * tile + 1}}}, {{{', '.join(f'${acc + d + j}' for j in range(4))}}};")
    lines += [mma(4 * i, "a0, a1, a2, a3", i) for i in range(tiles)]
    if xsum:
        lines.append(f"mov.b32 s, {one};")
        lines += [mma(4 * tiles + 4 * i, "s, s, s, s", i) for i in range(tiles)]
    return "{\n" + "\n".join(lines) + "\n}"


def mma_constraints(xsum: bool, tiles: int) -> str:
    outs = 4 * tiles * (2 if xsum else 1)
    return ",".join(["=r"] * outs + ["r"] + ["l"] * tiles + ([] if xsum else ["r", "r"]) + ["r"] * outs)


SUB_BF16, SUB_F16 = (tl.constexpr(mma_ptx(f16, False, 1)) for f16 in (False, True))
XSUM_BF16, XSUM_F16 = (tl.constexpr(mma_ptx(f16, True, 1)) for f16 in (False, True))
XSUM2_BF16, XSUM2_F16 = (tl.constexpr(mma_ptx(f16, True, 2)) for f16 in (False, True))
SUB_OPERANDS, XSUM_OPERANDS, XSUM2_OPERANDS = (tl.constexpr(mma_constraints(x, n))
                                               for x, n in ((False, 1), (True, 1), (True, 2)))


def shuffle_int4_mma(qweight: torch.Tensor) -> torch.Tensor:
    """GPTQ's qweight int32 [K/8, N] -> the MMA layout int32 [N/16, K/128, 32, 8] (the module docstring)."""
    k, n = qweight.shape[0] * INT4_PACK, qweight.shape[1]
    assert n % 16 == 0 and k % CHUNK == 0, f"int4 MMA layout: N a multiple of 16 and K of {CHUNK}, got {n} x {k}"
    q = unpack_int4(qweight).reshape(k // CHUNK, 4, STEPS, 4, n // 16, 2, 8)  # [chunk, t, j, k4, tile, half, g]
    word = torch.zeros((n // 16, k // CHUNK, 8, 4, STEPS), dtype=torch.int32, device=qweight.device)  # g, t, j
    for nibble, (column, offset) in enumerate(NIBBLES):
        part = q[:, :, :, offset, :, column // 8, :]  # [chunk, t, j, tile, g]
        word |= part.permute(3, 0, 4, 1, 2).to(torch.int32) << (4 * nibble)
    return word.reshape(n // 16, k // CHUNK, 32, STEPS).contiguous()


def unshuffle_int4_mma(words: torch.Tensor) -> torch.Tensor:
    """shuffle_int4_mma's inverse: the MMA layout -> GPTQ's qweight [K/8, N]."""
    tiles, chunks = words.shape[:2]
    w = words.reshape(tiles, chunks, 8, 4, STEPS)
    q = torch.zeros((chunks, 4, STEPS, 4, tiles, 2, 8), dtype=torch.int32, device=words.device)
    for nibble, (column, offset) in enumerate(NIBBLES):
        q[:, :, :, offset, :, column // 8, :] = ((w >> (4 * nibble)) & 0xF).permute(1, 3, 4, 0, 2)
    q = q.reshape(chunks * CHUNK // INT4_PACK, INT4_PACK, tiles * 16)
    shifts = torch.arange(0, 32, 4, device=words.device, dtype=torch.int32)[None, :, None]
    return (q << shifts).sum(1, dtype=torch.int32)


def mma_reference(x: torch.Tensor, words: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                  bias: torch.Tensor | None = None) -> torch.Tensor:
    """What the kernel computes, lane by lane, in torch float32: each lane's A registers from its word (nibble pairs
    (i, i + 4) for a(2i), a(2i+1)) and B registers from x, placed by PTX's mma.m16n8k16 fragment tables (A: row g
    for a0 a1 a4 a5, g + 8 for a2 a3 a6 a7, column 2t + (i & 1), + 8 for a4..a7; B: rows 2t + (i & 1), + 8 for
    b2 b3, column g), then D = A B per step and 8-row tile of x (rows 8 x_tile + g). Checks the layout's lane
    arithmetic on a CPU; x: [M <= 16, K]."""
    m, k = x.shape
    tiles, chunks = words.shape[:2]
    group = k // scales.shape[0]
    lane = torch.arange(32)
    g, t = lane // 4, lane % 4
    xs = torch.zeros((MAX_MMA_ROWS, k), dtype=torch.float32)
    xs[:m] = x.float().cpu()
    w = words.cpu().reshape(tiles, chunks, 32, STEPS)
    y = torch.zeros((MAX_MMA_ROWS, tiles * 16), dtype=torch.float32)
    for c in range(chunks):
        zc = zeros[(c * CHUNK) // group].float().cpu()
        sc = scales[(c * CHUNK) // group].float().cpu()
        for tile in range(tiles):
            d = torch.zeros((16, MAX_MMA_ROWS))
            for j in range(STEPS):
                a = torch.zeros((16, 16))
                word = w[tile, c, :, j]
                k0 = c * CHUNK + 32 * t + 4 * j
                for i in range(8):  # register element a_i: nibble pair (i // 2, i // 2 + 4), one of the pair
                    nibble = i // 2 + 4 * (i % 2)
                    row = g + 8 * ((i // 2) % 2)
                    col = 2 * t + (i % 2) + 8 * (i // 4)
                    a[row, col] = (((word >> (4 * nibble)) & 0xF).float()
                                   - zc[16 * tile + row])
                for x_tile in range(MAX_MMA_ROWS // 8):
                    b = torch.zeros((16, 8))
                    for i in range(4):  # b_i: row 2t + (i & 1) + 8 (i >= 2), column g: x[8 x_tile + g, k0 + i]
                        b[2 * t + (i % 2) + 8 * (i // 2), g] = xs[8 * x_tile + g, k0 + i]
                    d[:, 8 * x_tile:8 * x_tile + 8] += a @ b
            y[:, 16 * tile:16 * tile + 16] += (d * sc[16 * tile:16 * tile + 16, None]).t()
    y = y[:m]
    if bias is not None:
        y = y + bias.float().cpu()
    return y.to(x.dtype)


@triton.jit
def _mma_step(w, xv, z_lo, z_hi, c0, c1, c2, c3, F16: tl.constexpr):
    """One word against one 8-row tile of x, the zero point taken away per pair (mma_ptx(F16, False, 1))."""
    f = tl.float32
    return tl.inline_asm_elementwise(SUB_F16 if F16 else SUB_BF16, SUB_OPERANDS, [w, xv, z_lo, z_hi, c0, c1, c2, c3],
                                     dtype=(f, f, f, f), is_pure=True, pack=1)


@triton.jit
def _xsum_step(w, xv, c0, c1, c2, c3, s0, s1, s2, s3, F16: tl.constexpr):
    """One word against one 8-row tile of x, with the step's sums of x (mma_ptx(F16, True, 1))."""
    f = tl.float32
    return tl.inline_asm_elementwise(XSUM_F16 if F16 else XSUM_BF16, XSUM_OPERANDS,
                                     [w, xv, c0, c1, c2, c3, s0, s1, s2, s3], dtype=(f,) * 8, is_pure=True, pack=1)


@triton.jit
def _xsum2_step(w, xv, xv2, c0, c1, c2, c3, c4, c5, c6, c7, s0, s1, s2, s3, s4, s5, s6, s7, F16: tl.constexpr):
    """One word (one unpack) against two 8-row tiles of x, with the sums (mma_ptx(F16, True, 2))."""
    f = tl.float32
    return tl.inline_asm_elementwise(XSUM2_F16 if F16 else XSUM2_BF16, XSUM2_OPERANDS,
                                     [w, xv, xv2, c0, c1, c2, c3, c4, c5, c6, c7, s0, s1, s2, s3, s4, s5, s6, s7],
                                     dtype=(f,) * 16, is_pure=True, pack=1)


@triton.jit
def _zero_pair(zeros_ptr, offs, F16: tl.constexpr):
    """The packed 16-bit pair (MAGIC + z, MAGIC + z) of zeros at offs (MAGIC 128 bfloat16, 1024 float16)."""
    z = tl.load(zeros_ptr + offs).to(tl.float32)
    if F16:
        bits = (z + 1024.0).to(tl.float16).to(tl.int16, bitcast=True)
    else:
        bits = (z + 128.0).to(tl.bfloat16).to(tl.int16, bitcast=True)
    half = bits.to(tl.int32) & 0xFFFF
    return half | (half << 16)


@triton.jit
def fragments_to_tile(y0, y1, y2, y3, WARPS: tl.constexpr):
    """D's registers over the program ([32 WARPS] each; thread e is lane e % 32 = 4 g + t of warp e // 32) -> the
    [8, 16 WARPS] tile: y0 is row 2t, column 16 w + g; y1 row 2t + 1; y2 and y3 the same rows, column + 8."""
    out = tl.join(tl.join(y0, y1), tl.join(y2, y3))  # [32 WARPS, parity, half]: [..., p, h]
    out = tl.reshape(out, (WARPS, 8, 4, 2, 2))  # warp, g, t, parity, half
    return tl.reshape(tl.permute(out, (2, 3, 0, 4, 1)), (8, 16 * WARPS))  # (t, parity) rows, (warp, half, g) columns


@triton.jit
def _chunk_sums(z_lo, z_hi, c0, c1, c2, c3, s0, s1):
    """A chunk's XSUM sums less (MAGIC + z) * sum(x): c0, c1 of the lane's column (z_lo), c2, c3 of column + 8."""
    return c0 - z_lo * s0, c1 - z_lo * s1, c2 - z_hi * s0, c3 - z_hi * s1


@triton.jit
def _int4_mma_kernel(x_ptr, w_ptr, scales_ptr, zeros_ptr, bias_ptr, out_ptr, partial_ptr, count_ptr, M, N, K,
                     K_SPLIT, G, stride_xm, stride_om, HAS_BIAS: tl.constexpr, WARPS: tl.constexpr,
                     SPLIT_K: tl.constexpr, F16: tl.constexpr, XSUM: tl.constexpr = False, TILES: tl.constexpr = 1,
                     PDL: tl.constexpr = False):
    """Grid (N / (16 WARPS), SPLIT_K): warp w of program pid_n takes W's 16-column tile pid_n * WARPS + w over
    this split's chunks of K, against TILES 8-row tiles of x (2: rows 8-15 too, with XSUM, one unpack for both).
    Every tensor of the loop is [32 WARPS], one element a thread (element e is lane e % 32 of warp e // 32: the
    inline PTX's operands are that thread's registers), loaded with strides that Triton does not vectorize."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    BLOCK_N: tl.constexpr = 16 * WARPS
    MAGIC: tl.constexpr = 1024.0 if F16 else 128.0
    e = tl.arange(0, 32 * WARPS)
    lane = e % 32
    g = lane // 4
    t = lane % 4
    tile = pid_n * WARPS + e // 32
    col = tile * 16 + g  # the lane's W columns: col and col + 8
    chunks = K // 128
    k_lo = pid_k * K_SPLIT
    k_hi = tl.minimum(k_lo + K_SPLIT, K)
    words = w_ptr + (tile.to(tl.int64) * chunks * 32 + lane) * 8  # + (chunk * 32) * 8 + j
    x_words = x_ptr.to(tl.pointer_type(tl.int64))  # 4 x values a load
    x_rows = x_words + g.to(tl.int64) * (stride_xm // 4) + t * 8  # + k0 / 4 + j; rows 8 + g: + 8 stride_xm / 4
    if PDL:  # the first chunk's words into L2 before the wait (the weights are the model's: no kernel writes them)
        dependent_start(words + (k_lo // 128) * 256)
    zero = tl.zeros([32 * WARPS], dtype=tl.float32)
    y0, y1, y2, y3, y4, y5, y6, y7 = zero, zero, zero, zero, zero, zero, zero, zero
    for k0 in range(k_lo, k_hi, 128):
        group = (k0 // G) * N
        step_words = words + (k0 // 128) * 256
        c0, c1, c2, c3, c4, c5, c6, c7 = zero, zero, zero, zero, zero, zero, zero, zero
        if XSUM or TILES == 2:  # MAGIC + z of the lane's two columns, for the chunk's offset
            z_lo = tl.load(zeros_ptr + group + col).to(tl.float32) + MAGIC
            z_hi = tl.load(zeros_ptr + group + col + 8).to(tl.float32) + MAGIC
        if TILES == 2:
            s0, s1, s2, s3, s4, s5, s6, s7 = zero, zero, zero, zero, zero, zero, zero, zero
            for j in tl.static_range(8):
                w = tl.load(step_words + j)
                xv = tl.load(x_rows + (k0 // 4 + j), mask=g < M, other=0)
                xv2 = tl.load(x_rows + (8 * (stride_xm // 4) + k0 // 4 + j), mask=g + 8 < M, other=0)
                c0, c1, c2, c3, c4, c5, c6, c7, s0, s1, s2, s3, s4, s5, s6, s7 = _xsum2_step(
                    w, xv, xv2, c0, c1, c2, c3, c4, c5, c6, c7, s0, s1, s2, s3, s4, s5, s6, s7, F16)
            c0, c1, c2, c3 = _chunk_sums(z_lo, z_hi, c0, c1, c2, c3, s0, s1)
            c4, c5, c6, c7 = _chunk_sums(z_lo, z_hi, c4, c5, c6, c7, s4, s5)
        elif XSUM:
            s0, s1, s2, s3 = zero, zero, zero, zero
            for j in tl.static_range(8):
                w = tl.load(step_words + j)
                xv = tl.load(x_rows + (k0 // 4 + j), mask=g < M, other=0)
                c0, c1, c2, c3, s0, s1, s2, s3 = _xsum_step(w, xv, c0, c1, c2, c3, s0, s1, s2, s3, F16)
            c0, c1, c2, c3 = _chunk_sums(z_lo, z_hi, c0, c1, c2, c3, s0, s1)
        else:
            pair_lo = _zero_pair(zeros_ptr, group + col, F16)
            pair_hi = _zero_pair(zeros_ptr, group + col + 8, F16)
            for j in tl.static_range(8):
                w = tl.load(step_words + j)
                xv = tl.load(x_rows + (k0 // 4 + j), mask=g < M, other=0)
                c0, c1, c2, c3 = _mma_step(w, xv, pair_lo, pair_hi, c0, c1, c2, c3, F16)
        s_lo = tl.load(scales_ptr + group + col).to(tl.float32)
        s_hi = tl.load(scales_ptr + group + col + 8).to(tl.float32)
        y0 += s_lo * c0
        y1 += s_lo * c1
        y2 += s_hi * c2
        y3 += s_hi * c3
        if TILES == 2:
            y4 += s_lo * c4
            y5 += s_lo * c5
            y6 += s_hi * c6
            y7 += s_hi * c7
    out = fragments_to_tile(y0, y1, y2, y3, WARPS)
    if TILES == 2:  # rows 8-15 under rows 0-7
        out = tl.reshape(tl.permute(tl.join(out, fragments_to_tile(y4, y5, y6, y7, WARPS)), (2, 0, 1)),
                         (16, BLOCK_N))
    offs_m = tl.arange(0, 8 * TILES)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    finish_tile(out, bias_ptr, out_ptr, partial_ptr, count_ptr, pid_n, pid_k, offs_m, offs_n, offs_m < M,
                offs_n < N, N, stride_om, HAS_BIAS, 8 * TILES, BLOCK_N, SPLIT_K)


def mma_usable(x: torch.Tensor, n: int, k: int, group_size: int) -> bool:
    """Whether int4_mma_matmul runs for x: 1..16 rows of 16-bit x on an sm_90+ GPU, N % 16, K and the group % 128."""
    return (x.is_cuda and torch.cuda.get_device_capability(x.device) >= (9, 0) and 1 <= x.shape[0] <= MAX_MMA_ROWS
            and x.dtype in (torch.bfloat16, torch.float16) and n % 16 == 0 and k % CHUNK == 0
            and group_size % CHUNK == 0)


def int4_mma_matmul(x: torch.Tensor, words: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                    bias: torch.Tensor | None = None, split_k: int = 8, warps: int = 4,
                    xsum: bool = True) -> torch.Tensor:
    """x [M <= 16, K] @ W^T (+ bias) -> [M, N] in x's dtype, W from shuffle_int4_mma's words, GPTQ's scales and zeros
    [K/G, N]. split_k: K splits (whole chunks, none empty); warps: 16-column tiles a program; xsum: the zero point
    taken away once a chunk from x's sums (the kernel's XSUM) rather than from every weight pair (9-16 rows: always,
    both 8-row tiles from one unpack)."""
    m, k = x.shape
    tiles, chunks = words.shape[:2]
    n = tiles * 16
    group_size = k // scales.shape[0]
    assert words.shape == (tiles, k // CHUNK, 32, STEPS) and words.dtype == torch.int32 and words.is_contiguous()
    assert scales.shape == zeros.shape == (k // group_size, n) and scales.is_contiguous() and zeros.is_contiguous()
    assert mma_usable(x, n, k, group_size), "int4_mma_matmul: 1-16 rows of 16-bit x on sm_90+, N % 16, K and G % 128"
    assert x.stride(-1) == 1 and x.stride(0) % 4 == 0 and x.data_ptr() % 8 == 0
    assert n % (16 * warps) == 0
    out = x.new_empty((m, n))
    k_split = triton.cdiv(chunks, split_k) * CHUNK
    split_k = triton.cdiv(k, k_split)
    tiles_n = n // (16 * warps)
    x_tiles = 1 if m <= 8 else 2
    partial = counters = out
    if split_k > 1:
        assert tiles_n <= MAX_COLUMN_TILES
        partial = torch.empty((split_k, 8 * x_tiles, n), dtype=torch.float32, device=x.device)
        counters = split_k_counters(x.device)
    _int4_mma_kernel[(tiles_n, split_k)](
        x, words, scales, zeros, scales if bias is None else bias, out, partial, counters, m, n, k, k_split,
        group_size, x.stride(0), out.stride(0), HAS_BIAS=bias is not None, WARPS=warps, SPLIT_K=split_k,
        F16=x.dtype == torch.float16, XSUM=xsum or x_tiles == 2, TILES=x_tiles, num_warps=warps, num_stages=1,
        **pdl_launch(x.device))
    return out


# (N, K) -> int4_mma_matmul's (split_k, warps, xsum): none measured yet (s44); MMA_DEFAULT elsewhere
MMA_CONFIGS: dict[tuple[int, int], tuple[int, int, bool]] = {}
MMA_DEFAULT = (8, 4, True)


@triton.jit
def _int4_mma_dequant_kernel(w_ptr, scales_ptr, zeros_ptr, out_ptr, N, K, G):
    """Grid (N / 16, K / 128): one tile's chunk of words [32 lanes, 8 steps] -> W^T[k, n] in out's dtype, each nibble
    p at column 16 tile + g + 8 (p % 2) and K offset 128 chunk + 32 t + 4 j + 2 ((p // 2) % 2) + p // 4 (NIBBLES)."""
    tile = tl.program_id(0)
    chunk = tl.program_id(1)
    lane = tl.arange(0, 32)[:, None]
    j = tl.arange(0, 8)[None, :]
    words = tl.load(w_ptr + ((tile.to(tl.int64) * (K // 128) + chunk) * 32 + lane) * 8 + j)
    for p in tl.static_range(8):
        n = tile * 16 + lane // 4 + 8 * (p % 2)
        k = chunk * 128 + 32 * (lane % 4) + 4 * j + 2 * ((p // 2) % 2) + p // 4
        at = (k // G) * N + n
        q = ((words >> (4 * p)) & 0xF).to(tl.float32)
        w = (q - tl.load(zeros_ptr + at).to(tl.float32)) * tl.load(scales_ptr + at).to(tl.float32)
        tl.store(out_ptr + k.to(tl.int64) * N + n, w.to(out_ptr.dtype.element_ty))


def int4_mma_dequantize(words: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                        dtype: torch.dtype) -> torch.Tensor:
    """A new dense W^T [K, N] in `dtype` from the MMA layout (int4_dequant.int4_dequantize's, from the GPTQ one)."""
    tiles, chunks = words.shape[:2]
    n, k = tiles * 16, chunks * CHUNK
    out = torch.empty((k, n), dtype=dtype, device=words.device)
    _int4_mma_dequant_kernel[(tiles, chunks)](words, scales, zeros, out, n, k, k // scales.shape[0])
    return out


def int4_mma_linear_rows(x: torch.Tensor, words: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                         bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] on a GPU @ W^T (+ bias): the tensor-core kernel where mma_usable (MMA_CONFIGS' launch), else the
    dequantized weight and cuBLAS (rows past 16: prefill)."""
    n, k = words.shape[0] * 16, x.shape[1]
    if mma_usable(x, n, k, k // scales.shape[0]):
        split_k, warps, xsum = MMA_CONFIGS.get((n, k), MMA_DEFAULT)
        warps = next(w for w in (warps, 4, 2, 1) if n % (16 * w) == 0)  # whole 16-column tiles a program
        return int4_mma_matmul(x, words, scales, zeros, bias, split_k=split_k, warps=warps, xsum=xsum)
    out = x @ int4_mma_dequantize(words, scales, zeros, x.dtype)
    return out if bias is None else out + bias
