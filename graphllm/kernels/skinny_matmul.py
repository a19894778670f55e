"""y = x @ W^T (+ bias) for a few rows of x: the decode-step linear layers, as one Triton kernel.

At decode batch sizes (M <= 16 rows) a linear layer only streams its weight: [N, K] in
nn.Linear's layout, read once. cuBLAS reaches the copy bandwidth on the big projections but
not on the small ones (the 8B shape's qkv and o_proj ran at 76% of it on the H200), and it
splits K on some shapes, which adds a reduce kernel. Here program n takes BLOCK_N output
features and walks all of K in BLOCK_K steps, so the weight tile stream is pipelined and each
output is written once, with no split and no second kernel:

    acc[BLOCK_M, BLOCK_N] += x[:, k:k+BK] @ W[n:n+BN, k:k+BK]^T      (tl.dot, M padded to 16)

With BLOCK_M == 1 (one row) the product is a multiply-add over a [BLOCK_N, BLOCK_K] tile and
one sum at the end, no tensor cores. Accumulation is float32; the output has x's dtype.
"""

import functools

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

MAX_ROWS = 16  # the kernel's BLOCK_M: rows beyond this go to cuBLAS (compute-bound territory)
SMALL_WEIGHT = 1 << 25  # elements: qkv and o_proj of an 8B model, not its MLP
VOCAB_WIDE = 1 << 16  # output features: a vocabulary


def skinny_matmul_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The float32 oracle, in x's dtype. x: [M, K], weight: [N, K], bias: [N] or None -> [M, N]."""
    return F.linear(x.float(), weight.float(), None if bias is None else bias.float()).to(x.dtype)


@triton.jit(do_not_specialize=["M"])  # 2..16 rows share one compile
def _skinny_matmul_kernel(x_ptr, w_ptr, bias_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_om,
                          HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_K: tl.constexpr, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr,
                          PRECISION: tl.constexpr):
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    n_mask = offs_n < N
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :]  # [BLOCK_M, BLOCK_K]
    w_ptrs = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn + offs_k[None, :]  # [BLOCK_N, BLOCK_K]
    if BLOCK_M == 1:
        acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        if EVEN_K:
            x = tl.load(x_ptrs, mask=m_mask[:, None], other=0.0)
            if EVEN_N:
                w = tl.load(w_ptrs)
            else:
                w = tl.load(w_ptrs, mask=n_mask[:, None], other=0.0)
        else:
            k_mask = (k + offs_k) < K
            x = tl.load(x_ptrs, mask=m_mask[:, None] & k_mask[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=n_mask[:, None] & k_mask[None, :], other=0.0)
        if BLOCK_M == 1:
            acc += w.to(tl.float32) * x.to(tl.float32)  # [BLOCK_N, BLOCK_K] * [1, BLOCK_K]
        else:
            acc = tl.dot(x.to(w.dtype), tl.trans(w), acc, input_precision=PRECISION)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if BLOCK_M == 1:
        out = tl.sum(acc, 1)[None, :]  # [1, BLOCK_N]
    else:
        out = acc
    if HAS_BIAS:
        out += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    o_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 8


def default_config(m: int, n: int, k: int, device: torch.device) -> dict:
    """Tile sizes and launch options for an [m, k] x [n, k]^T product: the best of
    benchmarks/kernel_sweep.py's grid on the H200 at the Llama-3-8B shapes (2026-11-21).

    "Wide" outputs (at least four 64-column programs per SM, e.g. a vocabulary) take 64-column
    tiles; narrow ones take 16 columns with long K steps at one row, 32 columns at more rows.
    """
    wide = triton.cdiv(n, 64) >= 4 * _sm_count(device)
    if m == 1:
        config = (64, 256, 8) if wide else (16, 512, 4)
    else:
        config = (64, 128, 4) if wide else (32, 256, 4)
    block_n, block_k, warps = config
    return {"BLOCK_N": block_n, "BLOCK_K": min(block_k, max(16, triton.next_power_of_2(k))),
            "num_warps": warps, "num_stages": 4}


def beats_cublas(m: int, n: int, k: int) -> bool:
    """Where the kernel measured faster than cuBLAS (kernel_sweep, H200, bf16, CUDA-graph replay):
    one row against a small weight (qkv 3.42 vs 3.20 TB/s, o_proj 2.93 vs 2.69), and vocabulary-wide
    outputs at any row count up to 16 (lm_head 4.34-4.44 vs 4.18-4.22). cuBLAS kept the big MLP
    weights (gate_up, down) and small weights at 8-16 rows, where it was as fast or faster."""
    return m <= MAX_ROWS and (n >= VOCAB_WIDE or (m == 1 and n * k <= SMALL_WEIGHT))


def skinny_matmul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  config: dict | None = None) -> torch.Tensor:
    """x @ weight^T + bias for x: [M, K] with M <= MAX_ROWS (last-dim stride 1), weight: [N, K]
    contiguous, bias: [N] or None -> a new contiguous [M, N] in x's dtype. config: default_config's keys."""
    m, k = x.shape
    n = weight.shape[0]
    assert m <= MAX_ROWS and weight.shape[1] == k and weight.is_contiguous() and x.stride(-1) == 1
    out = x.new_empty((m, n))
    if m == 0:
        return out
    config = config or default_config(m, n, k, x.device)
    block_n, block_k = config["BLOCK_N"], config["BLOCK_K"]
    _skinny_matmul_kernel[(triton.cdiv(n, block_n),)](
        x, weight, weight if bias is None else bias, out, m, n, k, x.stride(0), weight.stride(0), out.stride(0),
        HAS_BIAS=bias is not None, BLOCK_M=1 if m == 1 else MAX_ROWS, BLOCK_N=block_n, BLOCK_K=block_k,
        EVEN_N=n % block_n == 0, EVEN_K=k % block_k == 0,
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        num_warps=config["num_warps"], num_stages=config["num_stages"])
    return out
