"""Quantized linear layers as registered custom ops: what the quantization passes put in place of
`aten.linear` (graphllm/passes/quantization/). Weights are in graphllm's internal layouts
(graphllm/kernels/quant_layout.py); every op computes y = x @ W^T (+ bias) in x's dtype:

    graphllm.fp8_linear(x, weight, weight_scale, input_scale, bias)   W8A8: x quantized to float8 per
                                                                      row (input_scale None) or with
                                                                      the static input_scale
    graphllm.int8_linear(x, weight, weight_scale, bias)               weight-only int8, per channel
    graphllm.int4_linear(x, qweight, scales, zeros, bias)             weight-only int4, per group
    graphllm.int4_linear_act_and_mul(x, qweight, scales, zeros, bias, gelu, interleaved)
                                                                      SwiGLU / GeGLU of int4_linear's
                                                                      halves or column pairs (linear_epilogue)
    graphllm.int4_linear_add_norm / int4_norm_linear                  an int4 product, the add_rms_norm after
                                                                      it and the next int4 product (row_sumsq)
    graphllm.int4_mma_linear(x, words, scales, zeros, bias)            int4_linear over the MMA layout
                                                                      (int4_mma_layout, opt-in)

and fp8_linear of a norm's or activation's output, one launch at one row (the linear_prologue pass with
CompileConfig.fp8_linear_prologue; other rows run the two ops): graphllm.fp8_rms_norm_linear,
fp8_add_rms_norm_linear (also returns h = x + residual), fp8_silu_and_mul_linear, fp8_gelu_tanh_and_mul_linear.

On CUDA in float16/bfloat16, by row count M (measured: benchmarks/quant_kernel_sweep.py, H200):
- fp8: graphllm/kernels/fp8_matmul.py at every M (its own small-M tiles, or row-wise torch._scaled_mm);
- int8, int4: M <= SMALL_M on graphllm's Triton kernels (int8_matmul.py, int4_matmul.py), which stream
  the packed weight; past that, the weight is dequantized to x's dtype and cuBLAS runs the matmul (their
  Triton GEMM tiles measured 2-10x slower than that at M = 32..256).
Anything else (CPU, float32) runs the pure-torch reference: dequantize, float32 matmul. Both compute
the same function, so CI proves the passes and loaders on CPU and the GPU tests prove the kernels.
"""

import torch

from graphllm.kernels import quant_layout as Q

HALF_DTYPES = (torch.float16, torch.bfloat16)
SMALL_M = 16  # int8 / int4: rows up to here run the packed-weight kernels


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as [M, K] with a dense last dim."""
    rows = x.reshape(-1, x.shape[-1])
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def _on_kernel(x: torch.Tensor) -> bool:
    return x.is_cuda and x.dtype in HALF_DTYPES and x.numel() > 0


@torch.library.custom_op("graphllm::fp8_linear", mutates_args=())
def fp8_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
               input_scale: torch.Tensor | None = None, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x: [..., K], weight: float8 [N, K], weight_scale: f32 [N], input_scale: f32 [1] or None -> [..., N]."""
    rows = _rows(x)
    if _on_kernel(x):
        from graphllm.kernels.fp8_matmul import fp8_matmul
        out = fp8_matmul(rows, weight, weight_scale, input_scale, bias)
    else:
        out = Q.fp8_linear_reference(rows, weight, weight_scale, input_scale, bias)
    return out.view(*x.shape[:-1], weight.shape[0])


@fp8_linear.register_fake
def _(x, weight, weight_scale, input_scale=None, bias=None):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@torch.library.custom_op("graphllm::fp8_quantize", mutates_args=())
def fp8_quantize(x: torch.Tensor, input_scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [..., K] -> (float8 [..., K], float32 scale [..., 1]): fp8_linear's activation quantization on its
    own (quant_layout.quantize_fp8_rows), so that Inductor fuses it into the op that produced x."""
    if _on_kernel(x):
        from graphllm.kernels.fp8_matmul import fp8_quantize_rows
        xq, scale = fp8_quantize_rows(_rows(x), input_scale)
    else:
        xq, scale = Q.quantize_fp8_rows(x, input_scale)
    scale = scale.reshape(*x.shape[:-1], 1).contiguous()
    if input_scale is not None and scale.data_ptr() == input_scale.data_ptr():
        scale = scale.clone()  # a static scale of one row comes back as itself: a custom op returns no alias
    return xq.view(x.shape), scale


@fp8_quantize.register_fake
def _(x, input_scale=None):
    return x.new_empty(x.shape, dtype=Q.FP8_DTYPE), x.new_empty((*x.shape[:-1], 1), dtype=torch.float32)


@torch.library.custom_op("graphllm::silu_and_mul_fp8", mutates_args=())
def silu_and_mul_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp8_quantize(silu_and_mul(x)) for x: [..., 2I]: (float8 [..., I], float32 scale [..., 1]), one kernel
    on CUDA (graphllm/kernels/silu_and_mul_fp8.py)."""
    if _on_kernel(x):
        from graphllm.kernels.silu_and_mul_fp8 import silu_and_mul_fp8 as kernel
        xq, scale = kernel(_rows(x))
    else:
        from graphllm.kernels.silu_and_mul_fp8 import silu_and_mul_fp8_reference
        xq, scale = silu_and_mul_fp8_reference(x)
    half = (*x.shape[:-1], x.shape[-1] // 2)
    return xq.view(half), scale.reshape(*x.shape[:-1], 1).contiguous()


@silu_and_mul_fp8.register_fake
def _(x):
    return (x.new_empty((*x.shape[:-1], x.shape[-1] // 2), dtype=Q.FP8_DTYPE),
            x.new_empty((*x.shape[:-1], 1), dtype=torch.float32))


@torch.library.custom_op("graphllm::fp8_linear_quantized", mutates_args=())
def fp8_linear_quantized(xq: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                         bias: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
    """fp8_linear after fp8_quantize: xq float8 [..., K], x_scale f32 [..., 1] -> [..., N] in out_dtype."""
    rows, scales = _rows(xq), x_scale.reshape(-1)
    if xq.is_cuda and out_dtype in HALF_DTYPES and xq.numel() > 0:
        from graphllm.kernels.fp8_matmul import fp8_matmul_quantized
        out = fp8_matmul_quantized(rows, scales.contiguous(), weight, weight_scale, bias, out_dtype)
    else:
        out = Q.fp8_quantized_linear_reference(rows, scales[:, None], weight, weight_scale, bias, out_dtype)
    return out.view(*xq.shape[:-1], weight.shape[0])


@fp8_linear_quantized.register_fake
def _(xq, x_scale, weight, weight_scale, bias, out_dtype):
    return xq.new_empty((*xq.shape[:-1], weight.shape[0]), dtype=out_dtype)


def _fp8_prologue_kernel(x: torch.Tensor, weight: torch.Tensor, *others: torch.Tensor | None) -> bool:
    """One fused launch (fp8_matmul.fp8_prologue_matmul): one row in half precision on CUDA, as the bf16 prologues
    (graphllm.ops.linear.takes_fused_kernel); other rows run the prologue's own kernel, then fp8_linear."""
    same = all(t is None or t.device == x.device for t in others)
    rows = x.numel() // x.shape[-1]
    return _on_kernel(x) and same and weight.is_contiguous() and rows == 1 and x.shape[-1] % 8 == 0


def _prologue_parts(linear, prologue: str, x: torch.Tensor, params: tuple, residual: torch.Tensor | None,
                    norm_weight: torch.Tensor | None, eps: float, unit_offset: bool):
    """(linear(prologue(x), *params), h or None) in two steps: what the fused ops compute off the one-row kernel
    path (the prologue's own kernel on CUDA, its reference elsewhere)."""
    from graphllm.ops.linear import _act_and_mul, _rms_norm
    if prologue in ("silu_mul", "gelu_mul"):
        return linear(_act_and_mul(x, prologue == "gelu_mul"), *params), None
    normed, h = _rms_norm(x, norm_weight, eps, residual, unit_offset)
    return linear(normed, *params), None if h is None else h.contiguous()


def _fp8_prologue_linear(prologue: str, x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                         input_scale: torch.Tensor | None, bias: torch.Tensor | None,
                         residual: torch.Tensor | None = None, norm_weight: torch.Tensor | None = None,
                         eps: float = 0.0, unit_offset: bool = False):
    if _fp8_prologue_kernel(x, weight, residual, norm_weight, bias) and (residual is None or residual.shape == x.shape):
        from graphllm.kernels.fp8_matmul import fp8_prologue_matmul
        out, h = fp8_prologue_matmul(prologue, _rows(x), weight, weight_scale, input_scale, bias,
                                     None if residual is None else _rows(residual), norm_weight, eps, unit_offset)
        return out.view(*x.shape[:-1], weight.shape[0]), None if h is None else h.view(x.shape)
    return _prologue_parts(fp8_linear, prologue, x, (weight, weight_scale, input_scale, bias), residual, norm_weight,
                           eps, unit_offset)


@torch.library.custom_op("graphllm::fp8_rms_norm_linear", mutates_args=())
def fp8_rms_norm_linear(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor,
                        weight_scale: torch.Tensor, input_scale: torch.Tensor | None = None,
                        bias: torch.Tensor | None = None, unit_offset: bool = False) -> torch.Tensor:
    """fp8_linear(rms_norm(x, norm_weight, eps, unit_offset), weight, weight_scale, input_scale, bias)."""
    return _fp8_prologue_linear("rms_norm", x, weight, weight_scale, input_scale, bias, None, norm_weight, eps,
                                unit_offset)[0]


@fp8_rms_norm_linear.register_fake
def _(x, norm_weight, eps, weight, weight_scale, input_scale=None, bias=None, unit_offset=False):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@torch.library.custom_op("graphllm::fp8_add_rms_norm_linear", mutates_args=())
def fp8_add_rms_norm_linear(x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                            weight: torch.Tensor, weight_scale: torch.Tensor, input_scale: torch.Tensor | None = None,
                            bias: torch.Tensor | None = None,
                            unit_offset: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """h = x + residual; (fp8_linear(rms_norm(h, norm_weight, eps, unit_offset), weight, ...), h) as new tensors."""
    return _fp8_prologue_linear("add_rms_norm", x, weight, weight_scale, input_scale, bias, residual, norm_weight,
                                eps, unit_offset)


@fp8_add_rms_norm_linear.register_fake
def _(x, residual, norm_weight, eps, weight, weight_scale, input_scale=None, bias=None, unit_offset=False):
    return x.new_empty((*x.shape[:-1], weight.shape[0])), x.new_empty(x.shape)


@torch.library.custom_op("graphllm::fp8_silu_and_mul_linear", mutates_args=())
def fp8_silu_and_mul_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                            input_scale: torch.Tensor | None = None, bias: torch.Tensor | None = None) -> torch.Tensor:
    """fp8_linear(silu_and_mul(x), weight, weight_scale, input_scale, bias) for x: [..., 2K]."""
    return _fp8_prologue_linear("silu_mul", x, weight, weight_scale, input_scale, bias)[0]


@fp8_silu_and_mul_linear.register_fake
def _(x, weight, weight_scale, input_scale=None, bias=None):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@torch.library.custom_op("graphllm::fp8_gelu_tanh_and_mul_linear", mutates_args=())
def fp8_gelu_tanh_and_mul_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                                 input_scale: torch.Tensor | None = None,
                                 bias: torch.Tensor | None = None) -> torch.Tensor:
    """fp8_linear(gelu_tanh_and_mul(x), weight, weight_scale, input_scale, bias) for x: [..., 2K] (Gemma)."""
    return _fp8_prologue_linear("gelu_mul", x, weight, weight_scale, input_scale, bias)[0]


@fp8_gelu_tanh_and_mul_linear.register_fake
def _(x, weight, weight_scale, input_scale=None, bias=None):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@torch.library.custom_op("graphllm::int8_linear", mutates_args=())
def int8_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    """x: [..., K], weight: int8 [N, K], weight_scale: f32 [N] -> [..., N]."""
    rows = _rows(x)
    if _on_kernel(x) and rows.shape[0] <= SMALL_M:
        from graphllm.kernels.int8_matmul import int8_matmul
        out = int8_matmul(rows, weight, weight_scale, bias)
    elif _on_kernel(x):  # W rounded to x's dtype (scale, then product: 2 roundings), cuBLAS
        dense = weight.to(x.dtype).mul_(weight_scale.to(x.dtype)[:, None])
        out = torch.nn.functional.linear(rows, dense, bias)
    else:
        out = Q.int8_linear_reference(rows, weight, weight_scale, bias)
    return out.view(*x.shape[:-1], weight.shape[0])


@int8_linear.register_fake
def _(x, weight, weight_scale, bias=None):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@torch.library.custom_op("graphllm::int4_linear", mutates_args=())
def int4_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    """x: [..., K], qweight: int32 [K/8, N], scales/zeros: [K/G, N] -> [..., N]."""
    rows = _rows(x)
    if _on_kernel(x) and rows.shape[0] <= SMALL_M:
        from graphllm.kernels.int4_matmul import int4_matmul
        out = int4_matmul(rows, qweight, scales, zeros, bias)
    elif _on_kernel(x):
        from graphllm.kernels.int4_dequant import int4_dequant_matmul
        out = int4_dequant_matmul(rows, qweight, scales, zeros, bias)
    else:
        out = Q.int4_linear_reference(rows, qweight, scales, zeros, bias)
    return out.view(*x.shape[:-1], qweight.shape[1])


@int4_linear.register_fake
def _(x, qweight, scales, zeros, bias=None):
    return x.new_empty((*x.shape[:-1], qweight.shape[1]))


@torch.library.custom_op("graphllm::int4_mma_linear", mutates_args=())
def int4_mma_linear(x: torch.Tensor, words: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                    bias: torch.Tensor | None = None) -> torch.Tensor:
    """int4_linear over the MMA layout (kernels/int4_mma.py's words [N/16, K/128, 32, 8], the int4_mma_layout
    pass's): on CUDA its tensor-core kernel up to 16 rows, the dequantized weight and cuBLAS past that; elsewhere
    the GPTQ layout again and the reference."""
    rows = _rows(x)
    n = words.shape[0] * 16
    if _on_kernel(x):
        from graphllm.kernels.int4_mma import int4_mma_linear_rows
        out = int4_mma_linear_rows(rows, words, scales, zeros, bias)
    else:
        from graphllm.kernels.int4_mma import unshuffle_int4_mma
        out = Q.int4_linear_reference(rows, unshuffle_int4_mma(words), scales, zeros, bias)
    return out.view(*x.shape[:-1], n)


@int4_mma_linear.register_fake
def _(x, words, scales, zeros, bias=None):
    return x.new_empty((*x.shape[:-1], words.shape[0] * 16))


@torch.library.custom_op("graphllm::int4_linear_act_and_mul", mutates_args=())
def int4_linear_act_and_mul(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                            bias: torch.Tensor | None = None, gelu: bool = False,
                            interleaved: bool = False) -> torch.Tensor:
    """act(y[..., :N]) * y[..., N:] with y = int4_linear(x, qweight, scales, zeros, bias) of width 2N (act silu,
    or with gelu tanh-approximated GELU); interleaved: act(y[..., 0::2]) * y[..., 1::2], the weight's columns an
    interleave_gate_up of [gate; up] (the linear_epilogue pass's layout) -> a new [..., N]. On CUDA at one row
    where the GEMV takes the shape (int4_matmul.fuses_activation) one launch computes it; elsewhere the two ops."""
    from graphllm.ops.linear import _act_and_mul
    rows = _rows(x)
    n, k = qweight.shape[1], rows.shape[1]
    if interleaved and _on_kernel(x) and rows.shape[0] == 1:
        from graphllm.kernels import int4_matmul as kernel
        if kernel.fuses_activation(1, n, k, k // scales.shape[0], x.device):
            out = kernel.int4_matmul(rows, qweight, scales, zeros, bias, epilogue=2 if gelu else 1)
            return out.view(*x.shape[:-1], n // 2)
    return _act_and_mul(int4_linear(x, qweight, scales, zeros, bias), gelu, interleaved)


@int4_linear_act_and_mul.register_fake
def _(x, qweight, scales, zeros, bias=None, gelu=False, interleaved=False):
    return x.new_empty((*x.shape[:-1], qweight.shape[1] // 2))


# The row_sumsq pass over int4 (graphllm/passes/lowering/row_sumsq.py): an int4 product and the add_rms_norm after it
# as one op, whose outputs the next int4 linear reads, so that at decode sizes no norm kernel runs between them:
#     graphllm.int4_linear_add_norm(x, qweight, scales, zeros, bias, residual, norm_weight, eps, unit_offset)
#         -> (xn, h, sumsq): y = int4_linear(x, ...), h = y + residual (the new residual), and the norm's output
#            for the next linear as xn and sumsq, [M, N/16] float32
#     graphllm.int4_norm_linear(xn, sumsq, eps, qweight, scales, zeros, bias, act)
#         = int4_linear of the norm's output, then (act 1 silu, 2 tanh GELU) the activation over an interleaved
#           gate_up's column pairs
# What xn and sumsq hold depends on where the pair runs, the same rows for both ops:
# - up to 16 rows on CUDA in half precision (_pair_kernels): xn = h * w (1 + w), rounded to h's dtype, and sumsq
#   h's sums of squares over each 16 columns; each op is one launch of the int4 kernels (the product's split-K
#   finish computes the add, the weight and the sums; the next product scales its float32 sums by each row's
#   1 / sqrt(mean(h^2) + eps) before the bias);
# - more rows on CUDA: xn is the norm's output (graphllm's RMSNorm row kernel, as the graph ran before the pass) and
#   sumsq is left unwritten; the next op is int4_linear of xn;
# - elsewhere (CPU, float32): as the kernels, in torch ops (int4_linear of (xn / rms) rounded).


def _pair_kernels(x: torch.Tensor) -> bool:
    """Whether the int4 norm pair runs its kernels for x's rows (the same answer for both ops: same rows)."""
    return _on_kernel(x) and _rows(x).shape[0] <= SMALL_M


@torch.library.custom_op("graphllm::int4_linear_add_norm", mutates_args=())
def int4_linear_add_norm(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                         bias: torch.Tensor | None, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                         unit_offset: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(xn, h, sumsq) for y = int4_linear(x, qweight, scales, zeros, bias) [..., N] and residual [..., N]: h = y +
    residual, and the RMSNorm of h (norm_weight, eps; Gemma's 1 + weight with unit_offset) as xn and sumsq [...,
    N / 16] float32 for int4_norm_linear (the comment above says what they hold where)."""
    rows, n = _rows(x), qweight.shape[1]
    res = _rows(residual)
    if _pair_kernels(x):
        from graphllm.kernels.int4_matmul import int4_matmul_add_norm
        xn, h, sumsq = int4_matmul_add_norm(rows, qweight, scales, zeros, bias, res, norm_weight, unit_offset)
    elif _on_kernel(x):
        from graphllm.kernels.rms_norm import rms_norm
        xn, h = rms_norm(int4_linear(rows, qweight, scales, zeros, bias), norm_weight, eps, res, unit_offset)
        sumsq = torch.empty((rows.shape[0], n // 16), dtype=torch.float32, device=x.device)  # not read
    else:
        h = (int4_linear(rows, qweight, scales, zeros, bias) + res).contiguous()
        hf = h.float()
        w = norm_weight.float() + 1.0 if unit_offset else norm_weight.float()
        xn, sumsq = (hf * w).to(h.dtype), (hf * hf).reshape(-1, n // 16, 16).sum(-1)
    lead = x.shape[:-1]
    return xn.view(*lead, n), h.view(*lead, n), sumsq.view(*lead, n // 16)


@int4_linear_add_norm.register_fake
def _(x, qweight, scales, zeros, bias, residual, norm_weight, eps, unit_offset=False):
    n = qweight.shape[1]
    out = x.new_empty((*x.shape[:-1], n))
    return out, x.new_empty((*x.shape[:-1], n)), x.new_empty((*x.shape[:-1], n // 16), dtype=torch.float32)


@torch.library.custom_op("graphllm::int4_norm_linear", mutates_args=())
def int4_norm_linear(xn: torch.Tensor, sumsq: torch.Tensor, eps: float, qweight: torch.Tensor, scales: torch.Tensor,
                     zeros: torch.Tensor, bias: torch.Tensor | None = None, act: int = 0) -> torch.Tensor:
    """int4_linear of the RMSNorm that int4_linear_add_norm's xn and sumsq hold (its eps again), then with act 1
    (silu) or 2 (tanh GELU) the activation over the columns' (gate j, up j) pairs (an interleaved gate_up) ->
    [..., N / 2]. The kernels (up to 16 rows on CUDA) scale the float32 sums of xn @ W^T by 1 / rms before the bias;
    the torch ops round xn / rms to xn's dtype first, as the norm rounds its output."""
    from graphllm.ops.linear import _act_and_mul
    rows, sums = _rows(xn), _rows(sumsq)
    n, k = qweight.shape[1], rows.shape[1]
    if _pair_kernels(xn):
        from graphllm.kernels import int4_matmul as kernel
        epilogue = act if act and kernel.fuses_activation(rows.shape[0], n, k, k // scales.shape[0], xn.device) else 0
        out = kernel.int4_matmul(rows, qweight, scales, zeros, bias, epilogue=epilogue, rstd=(sums, eps))
        if act and not epilogue:
            out = _act_and_mul(out, act == 2, True)
    else:
        normed = rows if _on_kernel(xn) else (
            rows.float() * torch.rsqrt(sums.sum(-1, keepdim=True) / k + eps)).to(xn.dtype)
        out = int4_linear(normed, qweight, scales, zeros, bias)
        if act:
            out = _act_and_mul(out, act == 2, True)
    return out.view(*xn.shape[:-1], out.shape[-1])


@int4_norm_linear.register_fake
def _(xn, sumsq, eps, qweight, scales, zeros, bias=None, act=0):
    return xn.new_empty((*xn.shape[:-1], qweight.shape[1] // (2 if act else 1)))


def kernel_route(scheme: str, rows: int, n: int, k: int, device: torch.device) -> str:
    """What a call of `rows` rows to the scheme's linear of weight [N, K] runs on `device` (bfloat16
    activations): the compiler records it per decode bucket in the artifact's manifest."""
    if device.type != "cuda":
        return "reference (dequantize, float32 matmul)"
    if scheme == "fp8":
        from graphllm.kernels import fp8_matmul as kernel
        config = kernel.CONFIGS.get((kernel.m_bucket(rows), n, k))
        if config is None and kernel.takes_scaled_mm(rows) and n % 16 == 0 and k % 16 == 0:  # scaled_mm_takes
            return "torch._scaled_mm row-wise"
        return f"fp8_matmul {_tiles(config or kernel.default_config(rows, n, k, device))}"
    if scheme == "int4_mma":
        from graphllm.kernels.int4_mma import MAX_MMA_ROWS, MMA_CONFIGS, MMA_DEFAULT
        if rows > MAX_MMA_ROWS:
            return "dequantize + cuBLAS"
        split_k, warps, xsum = MMA_CONFIGS.get((n, k), MMA_DEFAULT)
        return f"int4_mma {warps} warps/{split_k}" + (" xsum" if xsum or rows > 8 else "")
    if rows > SMALL_M:
        return "dequantize + cuBLAS"
    if scheme == "int8":
        from graphllm.kernels import int8_matmul as kernel
    else:
        from graphllm.kernels import int4_matmul as kernel
    return f"{scheme}_matmul {_tiles(kernel.default_config(rows, n, k, device))}"


def _tiles(config: dict) -> str:
    """A config as BLOCK_MxBLOCK_NxBLOCK_K/SPLIT_K (+ swap)."""
    text = f"{config['BLOCK_M']}x{config['BLOCK_N']}x{config['BLOCK_K']}/{config.get('SPLIT_K', 1)}"
    return text + (" swap" if config.get("SWAP_AB") else "")
