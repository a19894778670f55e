"""y = prologue(x) @ W^T (+ bias) for a few rows of x: the decode-step linear layers, as one Triton kernel.

At decode batch sizes (M <= 16 rows) a linear layer only streams its weight: [N, K] in
nn.Linear's layout, read once. What costs time beyond that stream is the kernels around it:
at batch 1 each layer of the 8B shape ran about 12 kernels, and every kernel boundary costs a
few microseconds of drain and ramp. So this kernel takes the small op before the matmul in
as a prologue, and reduces its own K splits, so a decode layer needs no norm, activation or
split-K reduce kernel of its own:

    PROLOGUE      the matmul's operand a, for rows of x                      extra output
    none          x                                                          -
    rms_norm      rms_norm(x) * norm_weight                                  -
    add_rms_norm  rms_norm(h) * norm_weight, h = x + residual                h (the new residual)
    silu_mul      silu(x[:, :K]) * x[:, K:]                                  -
    gelu_mul      gelu(x[:, :K], approximate="tanh") * x[:, K:] (Gemma)      -

With UNIT_OFFSET the norms scale by 1 + norm_weight in float32 and round once (Gemma's RMSNorm).

Grid (N / BLOCK_N, SPLIT_K). Program (n, s) walks its share of K in BLOCK_K steps, so the weight
tile stream is pipelined:

    acc[BLOCK_M, BLOCK_N] += a[:, k:k+BK] @ W[n:n+BN, k:k+BK]^T      (tl.dot, M padded to 16)

With BLOCK_M == 1 (one row) the product is a multiply-add over a [BLOCK_N, BLOCK_K] tile and
one sum at the end, no tensor cores. Accumulation is float32; the output has x's dtype.

- The norm prologues first read the whole rows of x (and residual) once for the mean square:
  at most 16 rows of K, from L2, beside an N x K weight stream. Program column 0 writes h. (In
  4096-column steps at one row, as fp8_matmul's passes take them, Llama-3-8B and Gemma 2 measured
  2-3% slower on the H200, 2026-11-29: the pass steps BLOCK_K.)
- SPLIT_K > 1: each program stores its float32 partial in a workspace, then counts itself in
  on a per-column-tile counter (atomic, acq_rel); the program that arrives last sums the
  partials in split order (deterministic), writes the output and resets the counter to 0.
  Counters live in one zeroed buffer per device and are always left at zero.
- The prologues round where the eager ops round (graphllm/kernels/reference.py:
  reference_rms_norm, reference_silu_and_mul): h to x's dtype, the normalised row to x's dtype before the
  weight, silu(gate) to x's dtype before the product with up.
"""

import functools

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from graphllm.kernels.gdc import dependent_start, weight_lines
from graphllm.kernels.launch import pdl_launch
from graphllm.kernels.rms_norm import rms_norm_reference
from graphllm.kernels.reference import reference_gelu_tanh_and_mul, reference_silu_and_mul
from graphllm.kernels.silu_and_mul import gelu_tanh

MAX_ROWS = 16  # the kernel's BLOCK_M: rows beyond this go to cuBLAS (compute-bound territory)
SMALL_WEIGHT = 1 << 25  # elements: qkv and o_proj of an 8B model, not its MLP
VOCAB_WIDE = 1 << 16  # output features: a vocabulary
PROLOGUES = {"none": 0, "rms_norm": 1, "add_rms_norm": 2, "silu_mul": 3, "gelu_mul": 4}
EPILOGUES = {"none": 0, "silu_mul": 1, "gelu_mul": 2}  # matmul_act_mul: act(x @ gate^T) * (x @ up^T)
MAX_COLUMN_TILES = 1 << 16  # split-K counters per device
SUMSQ_GROUP = 16  # columns per partial sum of squares (_store_row_sumsq); column tiles are multiples of it
_GROUP = tl.constexpr(SUMSQ_GROUP)
# (m, N, K) -> config where a shape's one-row launch measured better than default_config's rule, each also faster
# than cuBLAS there, so beats_cublas routes them here (benchmarks/kernel_sweep.py prologue-FAMILY, H200, 2026-11-29,
# CUDA-graph replay, us: this config against the rule's config / cuBLAS, or the unfused ops for a prologue shape)
CONFIGS: dict[tuple[int, int, int], dict] = {
    # Gemma 2 9B: qkv (add_rms_norm prologue) 18.3 against 19.6 / 19.1; o_proj 10.5 against 14.6
    (1, 8192, 3584): {"BLOCK_N": 32, "BLOCK_K": 512, "SPLIT_K": 1, "num_warps": 4, "num_stages": 4},
    (1, 3584, 4096): {"BLOCK_N": 16, "BLOCK_K": 512, "SPLIT_K": 1, "num_warps": 4, "num_stages": 4},
    # Phi-3-mini: o_proj 8.0 against 11.0; gate_up (add_rms_norm) 29.0 against 33.1 / 28.8; down (silu_mul) 16.1
    # against 16.6; lm_head 47.4 against 51.2 / cuBLAS 50.0
    (1, 3072, 3072): {"BLOCK_N": 16, "BLOCK_K": 512, "SPLIT_K": 1, "num_warps": 4, "num_stages": 4},
    (1, 16384, 3072): {"BLOCK_N": 32, "BLOCK_K": 512, "SPLIT_K": 1, "num_warps": 4, "num_stages": 4},
    (1, 3072, 8192): {"BLOCK_N": 16, "BLOCK_K": 256, "SPLIT_K": 4, "num_warps": 4, "num_stages": 4},
    (1, 32064, 3072): {"BLOCK_N": 32, "BLOCK_K": 256, "SPLIT_K": 1, "num_warps": 4, "num_stages": 4},
    # Llama-3-8B: qkv (add_rms_norm prologue) 16.5 against the rule's 19.7 / unfused 19.1 (2026-11-29, sweep-prologue)
    (1, 6144, 4096): {"BLOCK_N": 16, "BLOCK_K": 512, "SPLIT_K": 1, "num_warps": 4, "num_stages": 4},
    # OLMo 2 7B (qkv and gate_up without prologues): qkv 26.2 (the rule's config) against cuBLAS 28.1; o_proj
    # (Llama-3-8B's too) 11.6 against 15.2; down (silu_mul) 26.1 against 30.7 / 28.1
    (1, 12288, 4096): {"BLOCK_N": 16, "BLOCK_K": 256, "SPLIT_K": 1, "num_warps": 4, "num_stages": 4},
    (1, 4096, 4096): {"BLOCK_N": 32, "BLOCK_K": 256, "SPLIT_K": 4, "num_warps": 4, "num_stages": 4},
    (1, 4096, 11008): {"BLOCK_N": 32, "BLOCK_K": 512, "SPLIT_K": 2, "num_warps": 4, "num_stages": 4},
    # Qwen3-30B-A3B at one row (kernel_sweep prologue-qwen3moe, on an H100, 2026-12-06 s32; not yet on an H200):
    # qkv (add_rms_norm prologue) 10.1 against the rule's 11.0 / unfused 11.4; o_proj 9.5 against 9.8 / cuBLAS 10.0;
    # the router [128, 2048] in 8 K splits 3.7 against the rule's 2 splits 5.8 / cuBLAS 5.3
    (1, 5120, 2048): {"BLOCK_N": 16, "BLOCK_K": 512, "SPLIT_K": 1, "num_warps": 4, "num_stages": 4},
    (1, 2048, 4096): {"BLOCK_N": 16, "BLOCK_K": 256, "SPLIT_K": 4, "num_warps": 4, "num_stages": 4},
    (1, 128, 2048): {"BLOCK_N": 16, "BLOCK_K": 256, "SPLIT_K": 8, "num_warps": 4, "num_stages": 4},
    # Llama-3-8B qkv and down at 2-8 rows (the decode buckets 2, 4, 8), the best of kernel_sweep matmul8 at 8 rows
    # (H200, 2026-11-21): qkv 15.4 us against cuBLAS 15.6, down 32.3 against cuBLAS's split-K GEMM and its reduce
    # kernel, 32.0. A tie alone; in the engine they are programmatic dependents (PDL), which cuBLAS's are not:
    # batch 8 1,724.3 / 1,729.2 tok/s against 1,688.9 / 1,687.4 with cuBLAS there (H200, 2026-12-02, same call)
    **{(m, 6144, 4096): {"BLOCK_N": 64, "BLOCK_K": 256, "SPLIT_K": 1, "num_warps": 4, "num_stages": 4} for m in (2, 4, 8)},
    **{(m, 4096, 14336): {"BLOCK_N": 64, "BLOCK_K": 256, "SPLIT_K": 2, "num_warps": 4, "num_stages": 4} for m in (2, 4, 8)},
}


def skinny_matmul_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The float32 oracle, in x's dtype. x: [M, K], weight: [N, K], bias: [N] or None -> [M, N]."""
    return F.linear(x.float(), weight.float(), None if bias is None else bias.float()).to(x.dtype)


def rms_norm_matmul_reference(x, norm_weight, eps, weight, bias=None, residual=None, unit_offset=False):
    """(skinny_matmul_reference(rms_norm(h)), h or None) with h = x (+ residual), rounded like the eager ops."""
    normed, h = rms_norm_reference(x, norm_weight, eps, residual, unit_offset)
    return skinny_matmul_reference(normed, weight, bias), h


def gelu_mul_matmul_reference(x, weight, bias=None):
    return skinny_matmul_reference(reference_gelu_tanh_and_mul(x), weight, bias)


def silu_mul_matmul_reference(x, weight, bias=None):
    return skinny_matmul_reference(reference_silu_and_mul(x), weight, bias)


@triton.jit
def _operand(x_ptr, res_ptr, norm_w_ptr, new_res_ptr, rstd, offs_m, k, mk_mask, K, stride_xm, stride_rm,
             residual_rows, PROLOGUE: tl.constexpr, UNIT_OFFSET: tl.constexpr, normed_ptr=None,
             STORE_NORMED: tl.constexpr = False):
    """The matmul operand for columns k of the rows offs_m: [BLOCK_M, BLOCK_K] in x's dtype. STORE_NORMED (a norm
    prologue): the programs that store the new residual (residual_rows) store the norm's output too, [M, K]."""
    x = tl.load(x_ptr + offs_m[:, None] * stride_xm + k[None, :], mask=mk_mask, other=0.0)
    a = x
    if PROLOGUE == 3:  # silu_mul: x holds [gate | up], K columns each
        up = tl.load(x_ptr + offs_m[:, None] * stride_xm + K + k[None, :], mask=mk_mask, other=0.0)
        gate = x.to(tl.float32)
        act = (gate / (1.0 + tl.exp(-gate))).to(x.dtype)
        a = (act.to(tl.float32) * up.to(tl.float32)).to(x.dtype)
    if PROLOGUE == 4:  # gelu_mul: the same with GeGLU
        up = tl.load(x_ptr + offs_m[:, None] * stride_xm + K + k[None, :], mask=mk_mask, other=0.0)
        act = gelu_tanh(x.to(tl.float32)).to(x.dtype)
        a = (act.to(tl.float32) * up.to(tl.float32)).to(x.dtype)
    if PROLOGUE == 2:  # add_rms_norm: h = x + residual, in x's dtype
        res = tl.load(res_ptr + offs_m[:, None] * stride_rm + k[None, :], mask=mk_mask, other=0.0)
        a = (x.to(tl.float32) + res.to(tl.float32)).to(x.dtype)
        tl.store(new_res_ptr + offs_m[:, None] * K + k[None, :], a, mask=mk_mask & (offs_m < residual_rows)[:, None])
    if PROLOGUE == 1 or PROLOGUE == 2:
        norm_w = tl.load(norm_w_ptr + k, mask=k < K, other=0.0).to(tl.float32)[None, :]
        if UNIT_OFFSET:  # Gemma: 1 + weight, in float32, one rounding
            a = (a.to(tl.float32) * rstd * (1.0 + norm_w)).to(x.dtype)
        else:
            normed = (a.to(tl.float32) * rstd).to(x.dtype)
            a = (normed.to(tl.float32) * norm_w).to(x.dtype)
        if STORE_NORMED:
            tl.store(normed_ptr + offs_m[:, None] * K + k[None, :], a, mask=mk_mask & (offs_m < residual_rows)[:, None])
    return a


@triton.jit
def _row_rstd(x_ptr, res_ptr, offs_m, m_mask, K, eps, stride_xm, stride_rm,
              BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, PROLOGUE: tl.constexpr):
    """1 / sqrt(mean(h^2) + eps) per row, h = x (+ residual) rounded to x's dtype: [BLOCK_M, 1] float32."""
    sumsq = tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        mask = m_mask[:, None] & (k < K)[None, :]
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + k[None, :], mask=mask, other=0.0)
        if PROLOGUE == 2:
            res = tl.load(res_ptr + offs_m[:, None] * stride_rm + k[None, :], mask=mask, other=0.0)
            x = (x.to(tl.float32) + res.to(tl.float32)).to(x.dtype)
        xf = x.to(tl.float32)
        sumsq += xf * xf
    return tl.math.rsqrt(tl.sum(sumsq, 1) / K + eps)[:, None]


@triton.jit
def _store_row_sumsq(y, res_ptr, sumsq_ptr, pid_n, offs_m, offs_n, m_mask, n_mask, N, stride_rm,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The add_rms_norm after this product, its row statistics: h = y + residual rounded to y's dtype (as the
    norm's add rounds it), and sumsq[m, g] = sum of h^2 over the 16 columns 16g .. 16g + 15 (float32), for the
    BLOCK_N / 16 groups of this column tile. sumsq: [M, N // 16]."""
    mask = m_mask[:, None] & n_mask[None, :]
    res = tl.load(res_ptr + offs_m[:, None] * stride_rm + offs_n[None, :], mask=mask, other=0.0)
    h = (y.to(tl.float32) + res.to(tl.float32)).to(y.dtype).to(tl.float32)
    _store_sumsq(h, sumsq_ptr, pid_n, offs_m, m_mask, N, BLOCK_M, BLOCK_N)


@triton.jit
def _store_sumsq(h, sumsq_ptr, pid_n, offs_m, m_mask, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """sumsq[m, g] = sum of h^2 (h: [BLOCK_M, BLOCK_N] float32, column tile pid_n) over the 16 columns 16g ..
    16g + 15, for the BLOCK_N / 16 groups of this tile; sumsq: [M, N // 16] float32."""
    groups = tl.sum(tl.reshape(h * h, (BLOCK_M, BLOCK_N // _GROUP, _GROUP)), 2)
    g = pid_n * (BLOCK_N // _GROUP) + tl.arange(0, BLOCK_N // _GROUP)
    G = N // _GROUP
    tl.store(sumsq_ptr + offs_m[:, None] * G + g[None, :], groups, mask=m_mask[:, None] & (g < G)[None, :])


@triton.jit
def _store_add_norm(out, out_ptr, h_ptr, res_ptr, norm_w_ptr, sumsq_ptr, pid_n, offs_m, offs_n, m_mask, n_mask, N,
                    stride_om, stride_rm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, NORM: tl.constexpr):
    """finish_tile's NORM (1: the norm's weight w, 2: 1 + w, Gemma's): the add_rms_norm after this product, its
    part that needs no other column tile. y = out rounded as the linear's output, h = y + residual rounded as the
    norm's add (stored at h_ptr: the new residual), xn = h * w rounded to the dtype (at out_ptr: the next product's
    operand before its row's 1 / rms, which the next product applies to its sums), and h's 16-column sums of
    squares (_store_sumsq)."""
    dtype = out_ptr.dtype.element_ty
    mask = m_mask[:, None] & n_mask[None, :]
    res = tl.load(res_ptr + offs_m[:, None] * stride_rm + offs_n[None, :], mask=mask, other=0.0)
    h = (out.to(dtype).to(tl.float32) + res.to(tl.float32)).to(dtype)
    tl.store(h_ptr + offs_m[:, None] * stride_om + offs_n[None, :], h, mask=mask)
    w = tl.load(norm_w_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    if NORM == 2:
        w = 1.0 + w
    hf = h.to(tl.float32)
    tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :], (hf * w).to(dtype), mask=mask)
    _store_sumsq(hf, sumsq_ptr, pid_n, offs_m, m_mask, N, BLOCK_M, BLOCK_N)


@triton.jit
def _sumsq_rstd(sumsq_ptr, offs_m, m_mask, K, eps, GROUPS: tl.constexpr):
    """1 / sqrt(mean(h^2) + eps) per row from _store_row_sumsq's K // 16 group sums (summed here in one tree, the
    same order in every program): [BLOCK_M, 1] float32."""
    g = tl.arange(0, GROUPS)
    G = K // _GROUP
    s = tl.load(sumsq_ptr + offs_m[:, None] * G + g[None, :], mask=m_mask[:, None] & (g < G)[None, :], other=0.0)
    return tl.math.rsqrt(tl.sum(s, 1) / K + eps)[:, None]


@triton.jit
def finish_tile(out, bias_ptr, out_ptr, partial_ptr, count_ptr, pid_n, pid_k, offs_m, offs_n, m_mask, n_mask, N,
                stride_om, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr,
                res_ptr=None, sumsq_ptr=None, stride_rm=0, SUMSQ: tl.constexpr = False, EPILOGUE: tl.constexpr = 0,
                norm_w_ptr=None, h_ptr=None, NORM: tl.constexpr = 0):
    """Stores out + bias ([BLOCK_M, BLOCK_N] float32, this program's product) in out_ptr's dtype; with
    SPLIT_K > 1 out is one K split's partial, and the program of column tile pid_n that arrives last sums
    all splits' partials in split order (the deterministic scheme of the module docstring). Shared with the
    quantized siblings (fp8_matmul, int8_matmul, int4_matmul), whose tiles hold offs_m < BLOCK_M when split;
    m_mask says which of those rows are real (the partials of the others are neither stored nor read).
    SUMSQ: the program that stores the tile also stores its rows' sums of squares with res_ptr's residual
    added (_store_row_sumsq). EPILOGUE (1 silu, 2 tanh GELU; not with SUMSQ): the tile's columns are (gate j, up j)
    pairs of an interleave_gate_up weight, N of them, and the program that stores it stores act(gate) * up, the
    BLOCK_N // 2 columns pid_n * BLOCK_N // 2 + ... of an [M, N // 2] out (_store_act_and_mul). NORM (not with
    SUMSQ or EPILOGUE): the add_rms_norm after this product, as far as one tile goes (_store_add_norm): h = out +
    res_ptr's residual at h_ptr, h * norm_w_ptr's weight at out_ptr, h's sums of squares at sumsq_ptr."""
    if SPLIT_K > 1:
        # Partial [SPLIT_K, BLOCK_M, N] float32; the last program of this column tile to arrive sums them. Only
        # the M real rows travel (a 16-row tile at one row would write and read 16x the partial bytes).
        mn_mask = m_mask[:, None] & n_mask[None, :]
        p_ptrs = partial_ptr + (pid_k * BLOCK_M + offs_m[:, None]) * N + offs_n[None, :]
        tl.store(p_ptrs, out, mask=mn_mask)
        tl.debug_barrier()  # every thread's partial is stored before the count is released
        arrived = tl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel")
        if arrived == SPLIT_K - 1:
            out = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for s in tl.static_range(SPLIT_K):
                out += tl.load(partial_ptr + (s * BLOCK_M + offs_m[:, None]) * N + offs_n[None, :],
                               mask=mn_mask, other=0.0, cache_modifier=".cg")
            _store_finished(out, bias_ptr, out_ptr, pid_n, offs_m, offs_n, m_mask, n_mask, N, stride_om, HAS_BIAS,
                            BLOCK_M, BLOCK_N, res_ptr, sumsq_ptr, stride_rm, SUMSQ, EPILOGUE, norm_w_ptr, h_ptr, NORM)
            tl.atomic_xchg(count_ptr + pid_n, 0)
    else:
        _store_finished(out, bias_ptr, out_ptr, pid_n, offs_m, offs_n, m_mask, n_mask, N, stride_om, HAS_BIAS, BLOCK_M,
                        BLOCK_N, res_ptr, sumsq_ptr, stride_rm, SUMSQ, EPILOGUE, norm_w_ptr, h_ptr, NORM)


@triton.jit
def _store_finished(out, bias_ptr, out_ptr, pid_n, offs_m, offs_n, m_mask, n_mask, N, stride_om,
                    HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, res_ptr, sumsq_ptr, stride_rm,
                    SUMSQ: tl.constexpr, EPILOGUE: tl.constexpr, norm_w_ptr, h_ptr, NORM: tl.constexpr):
    """finish_tile's store of a whole product tile (out: [BLOCK_M, BLOCK_N] float32, every split summed): + bias,
    then the tile as it is, act(gate) * up (EPILOGUE) or the norm's part (NORM), and the sums of squares (SUMSQ)."""
    if HAS_BIAS:
        out += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    if EPILOGUE != 0:
        _store_act_and_mul(out, out_ptr, pid_n, offs_m, m_mask, N, stride_om, BLOCK_M, BLOCK_N, EPILOGUE)
    elif NORM != 0:
        _store_add_norm(out, out_ptr, h_ptr, res_ptr, norm_w_ptr, sumsq_ptr, pid_n, offs_m, offs_n, m_mask, n_mask, N,
                        stride_om, stride_rm, BLOCK_M, BLOCK_N, NORM)
    else:
        tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :], out.to(out_ptr.dtype.element_ty),
                 mask=m_mask[:, None] & n_mask[None, :])
    if SUMSQ:
        _store_row_sumsq(out.to(out_ptr.dtype.element_ty), res_ptr, sumsq_ptr, pid_n, offs_m, offs_n, m_mask, n_mask,
                         N, stride_rm, BLOCK_M, BLOCK_N)


@triton.jit
def _store_act_and_mul(out, out_ptr, pid_n, offs_m, m_mask, N, stride_om, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       EPILOGUE: tl.constexpr):
    """finish_tile's EPILOGUE: out [BLOCK_M, BLOCK_N] (bias added) holds column pairs (gate j, up j); stores
    act(gate) * up (_act_and_mul's roundings) to columns pid_n * BLOCK_N // 2 + ... of out_ptr's N // 2."""
    gate, up = tl.split(tl.reshape(out, [BLOCK_M, BLOCK_N // 2, 2]))
    offs_o = pid_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
    o_mask = offs_o < N // 2
    act = _act_and_mul(gate, up, out_ptr, offs_o, o_mask, N, out_ptr.dtype.element_ty, False, EPILOGUE)
    tl.store(out_ptr + offs_m[:, None] * stride_om + offs_o[None, :], act.to(out_ptr.dtype.element_ty),
             mask=m_mask[:, None] & o_mask[None, :])


@triton.jit
def _act_and_mul(gate, up, bias_ptr, offs_n, n_mask, N, dtype: tl.constexpr, HAS_BIAS: tl.constexpr,
                 EPILOGUE: tl.constexpr):
    """act(gate) * up in float32 from the float32 products of columns offs_n of [gate; up] (bias [2N]), each
    first rounded to dtype as the linear's output is, act(gate) rounded to dtype as silu_and_mul rounds it
    (EPILOGUE 1: silu, 2: tanh GELU); finish_tile rounds the product once more."""
    if HAS_BIAS:
        gate += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        up += tl.load(bias_ptr + N + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    g = gate.to(dtype).to(tl.float32)
    if EPILOGUE == 1:
        act = (g / (1.0 + tl.exp(-g))).to(dtype)
    else:
        act = gelu_tanh(g).to(dtype)
    return act.to(tl.float32) * up.to(dtype).to(tl.float32)


@triton.jit(do_not_specialize=["M", "eps"])  # 2..16 rows share one compile
def _skinny_matmul_kernel(x_ptr, res_ptr, norm_w_ptr, new_res_ptr, w_ptr, bias_ptr, out_ptr, partial_ptr, count_ptr,
                          sumsq_ptr, M, N, K, K_SPLIT, eps, stride_xm, stride_rm, stride_wn, stride_om,
                          PROLOGUE: tl.constexpr, UNIT_OFFSET: tl.constexpr, HAS_BIAS: tl.constexpr,
                          BLOCK_M: tl.constexpr,
                          BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
                          EVEN_N: tl.constexpr, EVEN_K: tl.constexpr, PRECISION: tl.constexpr,
                          PDL: tl.constexpr, EPILOGUE: tl.constexpr = 0, SUMSQ: tl.constexpr = 0,
                          GROUPS: tl.constexpr = 1, INTERLEAVED: tl.constexpr = False, normed_ptr=None,
                          STORE_NORMED: tl.constexpr = False):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    n_mask = offs_n < N
    residual_rows = M - M * tl.minimum(pid_n, 1)  # column tile 0 writes the new residual (and normed): M rows
    k_lo = pid_k * K_SPLIT
    k_hi = tl.minimum(k_lo + K_SPLIT, K)
    if PDL:  # nothing the kernels before write is read or written before this
        dependent_start(weight_lines(w_ptr, offs_n, N, k_lo, stride_wn, BLOCK_K))
    rstd = tl.zeros([BLOCK_M, 1], dtype=tl.float32)
    if (PROLOGUE == 1 or PROLOGUE == 2) and SUMSQ == 2:  # the product before stored the rows' statistics
        rstd = _sumsq_rstd(sumsq_ptr, offs_m, m_mask, K, eps, GROUPS)
    elif PROLOGUE == 1 or PROLOGUE == 2:
        rstd = _row_rstd(x_ptr, res_ptr, offs_m, m_mask, K, eps, stride_xm, stride_rm, BLOCK_M, BLOCK_K, PROLOGUE)
    w_ptrs = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn + (k_lo + offs_k)[None, :]  # [BLOCK_N, BLOCK_K]
    if BLOCK_M == 1:
        acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    u_ptrs = w_ptrs
    acc_u = acc
    if EPILOGUE != 0 and not INTERLEAVED:  # the up rows of [gate; up], N below the gate rows, into a second accumulator
        u_ptrs = w_ptrs + N.to(tl.int64) * stride_wn
        acc_u = tl.zeros(acc.shape, dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        k = k0 + offs_k
        if EVEN_K:
            mk_mask = m_mask[:, None]
            w_mask = n_mask[:, None]
        else:
            k_mask = k < k_hi
            mk_mask = m_mask[:, None] & k_mask[None, :]
            w_mask = n_mask[:, None] & k_mask[None, :]
        a = _operand(x_ptr, res_ptr, norm_w_ptr, new_res_ptr, rstd, offs_m, k, mk_mask, K, stride_xm, stride_rm,
                     residual_rows, PROLOGUE, UNIT_OFFSET, normed_ptr, STORE_NORMED)
        if EVEN_N and EVEN_K:
            w = tl.load(w_ptrs)
        else:
            w = tl.load(w_ptrs, mask=w_mask, other=0.0)
        if BLOCK_M == 1:
            acc += w.to(tl.float32) * a.to(tl.float32)  # [BLOCK_N, BLOCK_K] * [1, BLOCK_K]
        else:
            acc = tl.dot(a.to(w.dtype), tl.trans(w), acc, input_precision=PRECISION)
        if EPILOGUE != 0 and not INTERLEAVED:
            if EVEN_N and EVEN_K:
                u = tl.load(u_ptrs)
            else:
                u = tl.load(u_ptrs, mask=w_mask, other=0.0)
            if BLOCK_M == 1:
                acc_u += u.to(tl.float32) * a.to(tl.float32)
            else:
                acc_u = tl.dot(a.to(u.dtype), tl.trans(u), acc_u, input_precision=PRECISION)
            u_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if BLOCK_M == 1:
        out = tl.sum(acc, 1)[None, :]  # [1, BLOCK_N]
    else:
        out = acc
    if INTERLEAVED:  # rows (gate j, up j) side by side: the tile's columns pair up; SPLIT_K 1, rounded as below
        if HAS_BIAS:
            out += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        gate, up = tl.split(tl.reshape(out, [BLOCK_M, BLOCK_N // 2, 2]))
        out = _act_and_mul(gate, up, bias_ptr, offs_n, n_mask, N, out_ptr.dtype.element_ty, False, EPILOGUE)
        offs_o = pid_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
        finish_tile(out, bias_ptr, out_ptr, partial_ptr, count_ptr, pid_n, pid_k, offs_m, offs_o, m_mask,
                    offs_o < N // 2, N // 2, stride_om, False, BLOCK_M, BLOCK_N // 2, 1)
    elif EPILOGUE != 0:  # SPLIT_K 1: gate and up rounded as the linear's output, then silu_and_mul's rounding
        if BLOCK_M == 1:
            out_u = tl.sum(acc_u, 1)[None, :]
        else:
            out_u = acc_u
        out = _act_and_mul(out, out_u, bias_ptr, offs_n, n_mask, N, out_ptr.dtype.element_ty, HAS_BIAS, EPILOGUE)
        finish_tile(out, bias_ptr, out_ptr, partial_ptr, count_ptr, pid_n, pid_k, offs_m, offs_n, m_mask, n_mask, N,
                    stride_om, False, BLOCK_M, BLOCK_N, 1)
    else:  # SUMSQ 1: res_ptr is the residual of the add_rms_norm after this product (PROLOGUE 0, 3 or 4)
        finish_tile(out, bias_ptr, out_ptr, partial_ptr, count_ptr, pid_n, pid_k, offs_m, offs_n, m_mask, n_mask, N,
                    stride_om, HAS_BIAS, BLOCK_M, BLOCK_N, SPLIT_K, res_ptr, sumsq_ptr, stride_rm, SUMSQ == 1)


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 8


_COUNTERS: dict[torch.device, torch.Tensor] = {}


def split_k_counters(device: torch.device) -> torch.Tensor:
    """The split-K arrival counters of a device (finish_tile's count_ptr, MAX_COLUMN_TILES of them): zeroed
    once, and every kernel leaves them at zero. Shared by the quantized siblings: kernels on one stream run
    one after another, so one set serves them all."""
    if device not in _COUNTERS:
        _COUNTERS[device] = torch.zeros(MAX_COLUMN_TILES, dtype=torch.int32, device=device)
    return _COUNTERS[device]


_counters = split_k_counters  # the name tests/kernels/test_skinny_matmul.py reads


def default_config(m: int, n: int, k: int, device: torch.device) -> dict:
    """Tile sizes, K splits and launch options for an [m, k] x [n, k]^T product: the best of
    benchmarks/kernel_sweep.py's grids on the H200 at the Llama-3-8B shapes (2026-11-21).

    Shapes in CONFIGS take their measured entry. One row: 16-column tiles in 256-column K steps, except a K at
    least twice N (down_proj), which takes 32 columns and 4 K splits (31.0 us against 38.6 with 2 splits of 16
    columns).
    More rows: 64-column tiles for "wide" outputs (at least four 64-column programs per SM, e.g.
    a vocabulary) in 128-column K steps, and for MLP up-projections (N >= 4K: gate_up at 8 rows,
    60.5 us against 63.8 with 32 columns) in 256-column K steps; 32 columns otherwise; no split.
    """
    if (m, n, k) in CONFIGS:
        return dict(CONFIGS[(m, n, k)])
    split_k = 1
    if m == 1:
        block_n, block_k, warps = 16, 256, 4
        if k >= 2 * n:
            block_n, split_k = 32, 4
    else:
        wide = triton.cdiv(n, 64) >= 4 * _sm_count(device)
        block_n, block_k, warps = (64, 128, 4) if wide else (64, 256, 4) if n >= 4 * k else (32, 256, 4)
    block_k = min(block_k, max(16, triton.next_power_of_2(k)))
    split_k = max(1, min(split_k, k // (4 * block_k)))  # at least four K steps per split
    return {"BLOCK_N": block_n, "BLOCK_K": block_k, "SPLIT_K": split_k, "num_warps": warps, "num_stages": 4}


def beats_cublas(m: int, n: int, k: int) -> bool:
    """Where the kernel measured faster than cuBLAS (kernel_sweep, H200, bf16, CUDA-graph replay):
    one row against a small weight (qkv 3.42 vs 3.20 TB/s, o_proj 2.93 vs 2.69), and vocabulary-wide
    outputs at any row count up to 16 (lm_head 4.34-4.44 vs 4.18-4.22). At 2-8 rows (kernel_sweep
    matmul8 at 8 rows, same run, us): square small weights (o_proj 11.8 vs 12.5) and MLP
    up-projections, N >= 4K (gate_up 60.5 vs 62.7). qkv and down at 2-8 rows were a tie alone (15.4 vs
    15.6, 32.3 vs 32.0); cuBLAS keeps them at 9-16 rows, gate_up at one row (the fused prologue path takes
    it there) and everything at 9-16 rows but the vocabulary (not measured). down_proj at one row (K >= 2N)
    takes the kernel: 31.4 us with the rule's config (and SwiGLU in its prologue) against cuBLAS 31.3
    (kernel_sweep prologue-llama, 2026-11-29), and the kernel is a programmatic dependent (PDL) in the engine,
    which cuBLAS's kernels are not. Shapes in CONFIGS were measured faster than cuBLAS with their config
    (OLMo 2's qkv and Phi-3's lm_head at one row among them), or, for the 8B qkv and down at 2-8 rows, faster
    end to end: batch 8 1,724-1,729 tok/s against 1,687-1,689 on cuBLAS (H200, 2026-12-02, same call)."""
    if not 1 <= m <= MAX_ROWS:
        return False
    if n >= VOCAB_WIDE or (m, n, k) in CONFIGS:  # CONFIGS: measured faster than cuBLAS too
        return True
    if m == 1:  # and down_proj shapes (K >= 2N): linear_epilogue leaves them plain at one row
        return n * k <= SMALL_WEIGHT or k >= 2 * n
    return m <= 8 and ((n == k and n * k <= SMALL_WEIGHT) or n >= 4 * k)


def fuses_activation(m: int, n: int, k: int) -> bool:
    """Where silu_mul_matmul (SwiGLU / GeGLU in the prologue) replaces silu_and_mul's row kernel and the product:
    one row. At 2-8 rows (01fc21e took the 8B down_proj there) the prologue's activation over padded 16-row operand
    tiles made batch 8 18% slower: 1,092.5 against 1,339.7 tok/s without it (H100, same call, 2026-12-06; step
    p50 7.31 against 5.96 ms), so those rows run silu_and_mul's row kernel, then the product. n, k: the product's
    weight shape (kept for the callers' rule)."""
    return m == 1


def _launch(prologue: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
            config: dict | None, residual: torch.Tensor | None = None, norm_weight: torch.Tensor | None = None,
            eps: float = 0.0, unit_offset: bool = False, epilogue: str = "none",
            sumsq: torch.Tensor | None = None, sumsq_residual: torch.Tensor | None = None,
            interleaved: bool = False, normed: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """normed (a norm prologue): where the kernel also stores the norm's output ([M, K], x's dtype). sumsq with a
    norm prologue: the rows' statistics that the product before stored (row_sumsq_matmul), read in
    place of the rows; sumsq with sumsq_residual: this product stores them into sumsq ([M, N // 16] float32).
    interleaved (with an epilogue): the weight's rows are gate and up in turn (interleave_gate_up), and a tile of
    the plain product's columns holds both halves of its outputs."""
    m = x.shape[0]
    n, k = weight.shape
    assert m <= MAX_ROWS and weight.is_contiguous() and x.stride(-1) == 1
    assert normed is None or (prologue in ("rms_norm", "add_rms_norm") and sumsq is None
                              and normed.shape == x.shape and normed.is_contiguous()), prologue
    sumsq_mode = 0
    if sumsq is not None:
        norm = prologue in ("rms_norm", "add_rms_norm")
        assert norm == (sumsq_residual is None) and epilogue == "none", (prologue, epilogue)
        groups = k if norm else n
        assert groups % SUMSQ_GROUP == 0 and sumsq.shape == (m, groups // SUMSQ_GROUP), (sumsq.shape, m, groups)
        assert sumsq.dtype == torch.float32 and sumsq.is_contiguous()
        sumsq_mode = 2 if norm else 1
        if sumsq_residual is not None:
            assert sumsq_residual.shape == (m, n) and sumsq_residual.stride(-1) == 1, (sumsq_residual.shape, m, n)
            residual = sumsq_residual
    assert x.shape[1] == (2 * k if prologue in ("silu_mul", "gelu_mul") else k), (prologue, x.shape, weight.shape)
    if epilogue != "none":  # weight [gate; up]: the output is act(gate) * up, half as wide
        assert n % 2 == 0 and prologue not in ("silu_mul", "gelu_mul"), (prologue, epilogue, weight.shape)
        config = config or (interleaved_config if interleaved else epilogue_config)(m, n, k, x.device)
        assert config.get("SPLIT_K", 1) == 1, config
        if not interleaved:
            n //= 2
    out = x.new_empty((m, n // 2 if interleaved else n))
    new_residual = None
    if residual is not None and sumsq_mode != 1:
        assert residual.shape == x.shape and residual.stride(-1) == 1
        new_residual = x.new_empty((m, k))
    if m == 0:
        return out, new_residual
    config = config or default_config(m, n, k, x.device)
    block_m, block_n, block_k = 1 if m == 1 else MAX_ROWS, config["BLOCK_N"], config["BLOCK_K"]
    assert sumsq_mode != 1 or block_n % SUMSQ_GROUP == 0, config
    split_k = config.get("SPLIT_K", 1)
    k_split = triton.cdiv(triton.cdiv(k, split_k), block_k) * block_k
    split_k = triton.cdiv(k, k_split)  # no empty splits
    tiles = triton.cdiv(n, block_n)
    partial = counters = out
    if split_k > 1:
        assert tiles <= MAX_COLUMN_TILES
        partial = torch.empty((split_k, block_m, n), dtype=torch.float32, device=x.device)
        counters = split_k_counters(x.device)
    _skinny_matmul_kernel[(tiles, split_k)](
        x, x if residual is None else residual, x if norm_weight is None else norm_weight,
        out if new_residual is None else new_residual, weight, weight if bias is None else bias, out, partial,
        counters, out if sumsq is None else sumsq, m, n, k, k_split, eps, x.stride(0),
        0 if residual is None else residual.stride(0),
        weight.stride(0), out.stride(0),
        PROLOGUE=PROLOGUES[prologue], UNIT_OFFSET=unit_offset, HAS_BIAS=bias is not None, BLOCK_M=block_m,
        BLOCK_N=block_n, BLOCK_K=block_k,
        SPLIT_K=split_k, EVEN_N=n % block_n == 0, EVEN_K=k_split * split_k == k,
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32", EPILOGUE=EPILOGUES[epilogue], SUMSQ=sumsq_mode,
        GROUPS=triton.next_power_of_2(k // SUMSQ_GROUP) if sumsq_mode == 2 else 1, INTERLEAVED=interleaved,
        normed_ptr=out if normed is None else normed, STORE_NORMED=normed is not None,
        num_warps=config["num_warps"], num_stages=config["num_stages"], **pdl_launch(x.device))
    return out, new_residual


def skinny_matmul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  config: dict | None = None) -> torch.Tensor:
    """x @ weight^T + bias for x: [M, K] with M <= MAX_ROWS (last-dim stride 1), weight: [N, K]
    contiguous, bias: [N] or None -> a new contiguous [M, N] in x's dtype. config: default_config's keys."""
    return _launch("none", x, weight, bias, config)[0]


def rms_norm_matmul(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor,
                    bias: torch.Tensor | None = None, residual: torch.Tensor | None = None,
                    config: dict | None = None, unit_offset: bool = False,
                    sumsq: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(rms_norm(h) * norm_weight) @ weight^T + bias with h = x (+ residual): x, residual: [M, K],
    norm_weight: [K] in x's dtype -> ([M, N], h as a new [M, K] when residual is given, else None).
    unit_offset: the norm scales by 1 + norm_weight in float32 (Gemma's). sumsq: h's statistics as
    row_sumsq_matmul stored them ([M, K // 16]): each program reads those instead of the rows whole."""
    assert norm_weight.shape == (x.shape[1],) and norm_weight.dtype == x.dtype
    return _launch("rms_norm" if residual is None else "add_rms_norm", x, weight, bias, config,
                   residual=residual, norm_weight=norm_weight, eps=eps, unit_offset=unit_offset, sumsq=sumsq)


def rms_norm_matmul_normed(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor,
                           bias: torch.Tensor | None = None, residual: torch.Tensor | None = None,
                           config: dict | None = None,
                           unit_offset: bool = False) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """rms_norm_matmul that also returns the norm's output y = rms_norm(h) * norm_weight ([M, K], new), stored by
    the programs of the first column tile as they read it: the operand the product used, for the norm's other
    readers (a MoE layer's router and its experts read one norm: ops/linear.add_rms_norm_linear_normed)."""
    assert norm_weight.shape == (x.shape[1],) and norm_weight.dtype == x.dtype
    normed = x.new_empty(x.shape)
    out, h = _launch("rms_norm" if residual is None else "add_rms_norm", x, weight, bias, config, residual=residual,
                     norm_weight=norm_weight, eps=eps, unit_offset=unit_offset, normed=normed)
    return out, h, normed


def row_sumsq_matmul(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor, bias: torch.Tensor | None = None,
                     config: dict | None = None, act: str = "none",
                     sumsq: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, sumsq): y = a @ weight^T + bias as skinny_matmul computes it, a = x, or with act "silu" / "gelu"
    act(x[:, :K]) * x[:, K:] as silu_mul_matmul computes it; sumsq: [M, N // 16] float32, the sums of h^2 over
    each 16 columns of h = y + residual (residual: [M, N], the sum rounded to x's dtype): what
    rms_norm_matmul(y, ..., residual=residual, sumsq=sumsq) needs to normalise h without reading its rows whole.
    The column tile must be a multiple of 16 columns, N too. sumsq: where to store them (else a new tensor)."""
    prologue = {"none": "none", "silu": "silu_mul", "gelu": "gelu_mul"}[act]
    if sumsq is None:
        sumsq = torch.empty((x.shape[0], weight.shape[0] // SUMSQ_GROUP), dtype=torch.float32, device=x.device)
    out, _ = _launch(prologue, x, weight, bias, config, sumsq=sumsq, sumsq_residual=residual)
    return out, sumsq


def row_sumsq_reference(y: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """row_sumsq_matmul's sumsq from its y, in float32: [M, N // 16]."""
    h = (y.float() + residual.float()).to(y.dtype).float()
    return (h * h).view(y.shape[0], -1, SUMSQ_GROUP).sum(-1)


def takes_row_sumsq(m: int, before: tuple[int, int], after: tuple[int, int]) -> bool:
    """Where a product of weight shape `before` ([N, K]; down_proj's with SwiGLU in its prologue too) stores the
    row statistics of the add_rms_norm after it, and the product after it, of weight shape `after` ([N2, N]),
    takes the norm in its prologue from them (rms_norm_matmul's sumsq):
    - one row where the first product runs this kernel (the norm after it is the next product's one-row prologue
      whatever that product's shape, ops/linear.takes_fused_kernel): each of its programs read the row whole
      first, 8 KB at K 4096 (plus the residual's), K / BLOCK_K dependent steps before its weight stream;
    - 2-8 rows where both products run this kernel anyway (beats_cublas): the norm's row kernel between them goes
      (the prologue would read the rows whole in every program: gate_up at 8 rows measured 95 us against 59 for
      the two launches that way, kernel_sweep prologue, H200, 2026-11-21).
    A decode layer's two norms (the post-attention norm between o_proj and gate_up, the next layer's input norm
    between down and qkv) are the pairs."""
    (n, k), (n2, k2) = before, after
    if k2 != n or n % SUMSQ_GROUP or not beats_cublas(m, n, k):
        return False
    return m == 1 or (2 <= m <= 8 and beats_cublas(m, n2, k2))


def epilogue_config(m: int, n: int, k: int, device: torch.device) -> dict:
    """The config of an [m, k] x [n, k]^T product whose output columns are act(gate) * up over the weight's
    halves: default_config's for the whole [n, k] weight with half its columns per tile from each half (the
    bytes a program streams per K step, and the grid, stay those of the plain product), no K split."""
    config = default_config(m, n, k, device)
    config["BLOCK_N"] = max(8 if m == 1 else 16, config["BLOCK_N"] // 2)
    config["SPLIT_K"] = 1
    return config


# (m, N, K) -> the interleaved epilogue's config where kernel_sweep epilogue measured one better than
# interleaved_config's rule (H200, 2026-12-06, s31 call 2, CUDA-graph replay under PDL, us: this config against
# the rule's; the plain gate_up product at the rule's config in brackets)
INTERLEAVED_CONFIGS: dict[tuple[int, int, int], dict] = {
    # Llama-3-8B gate_up at 2-8 rows: 3 stages, not 4: 57.5 / 58.1 against 63.4 / 63.9 at 2 / 8 rows [59.4 / 59.7]
    **{(m, 28672, 4096): {"BLOCK_N": 64, "BLOCK_K": 256, "SPLIT_K": 1, "num_warps": 4, "num_stages": 3}
       for m in (2, 4, 8)},
    # Phi-3-mini gate_up: one row 26.2 against 26.8 [26.8]; 2 / 8 rows 26.4 / 26.6 against 28.0 / 28.5 [27.0 / 27.4]
    (1, 16384, 3072): {"BLOCK_N": 32, "BLOCK_K": 256, "SPLIT_K": 1, "num_warps": 4, "num_stages": 4},
    **{(m, 16384, 3072): {"BLOCK_N": 128, "BLOCK_K": 128, "SPLIT_K": 1, "num_warps": 4, "num_stages": 4}
       for m in (2, 4, 8)},
}


def interleaved_config(m: int, n: int, k: int, device: torch.device) -> dict:
    """The config of matmul_act_mul over an interleaved weight: INTERLEAVED_CONFIGS' measured entry, else
    default_config's for the whole [n, k] weight (a tile of the plain product's columns holds both halves of half
    as many outputs), no K split."""
    if (m, n, k) in INTERLEAVED_CONFIGS:
        return dict(INTERLEAVED_CONFIGS[(m, n, k)])
    return {**default_config(m, n, k, device), "SPLIT_K": 1}


def interleave_gate_up(weight: torch.Tensor) -> torch.Tensor:
    """[gate; up] ([2N, ...]: a weight or a bias) -> its rows in the order gate 0, up 0, gate 1, up 1, ...: the
    layout of matmul_act_mul's interleaved=True, a new contiguous tensor."""
    n = weight.shape[0] // 2
    assert weight.shape[0] == 2 * n, weight.shape
    return torch.stack((weight[:n], weight[n:]), dim=1).reshape(weight.shape).contiguous()


def matmul_act_mul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                   config: dict | None = None, gelu: bool = False, residual: torch.Tensor | None = None,
                   norm_weight: torch.Tensor | None = None, eps: float = 0.0,
                   unit_offset: bool = False, interleaved: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """silu_and_mul(a @ weight^T + bias) in one launch, for weight [gate; up]: [2N, K], bias [2N] or None ->
    ([M, N], h or None), a = x, or with norm_weight rms_norm(h) * norm_weight with h = x (+ residual) as
    rms_norm_matmul takes it; gelu: tanh GELU in place of silu (GeGLU). Gate and up are rounded to x's dtype,
    then act(gate) and the product as silu_and_mul rounds them: the two ops' result, one launch and no [M, 2N]
    intermediate. config: epilogue_config's keys, SPLIT_K 1. interleaved: weight and bias are
    interleave_gate_up's of [gate; up] (config: interleaved_config's), and each program streams one tile of rows
    for both halves."""
    prologue = "none" if norm_weight is None else "rms_norm" if residual is None else "add_rms_norm"
    if norm_weight is not None:
        assert norm_weight.shape == (x.shape[1],) and norm_weight.dtype == x.dtype
    return _launch(prologue, x, weight, bias, config, residual=residual, norm_weight=norm_weight, eps=eps,
                   unit_offset=unit_offset, epilogue="gelu_mul" if gelu else "silu_mul", interleaved=interleaved)


def silu_mul_matmul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                    config: dict | None = None, gelu: bool = False) -> torch.Tensor:
    """(silu(x[:, :K]) * x[:, K:]) @ weight^T + bias for x: [M, 2K], weight: [N, K] -> [M, N]; gelu: with
    gelu(x[:, :K], approximate="tanh") in place of silu (Gemma's GeGLU)."""
    return _launch("gelu_mul" if gelu else "silu_mul", x, weight, bias, config)[0]
