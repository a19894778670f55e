"""graphllm's internal layouts of quantized linear weights, and their pure-torch references.

One layout per scheme, shared by the on-the-fly quantization passes (graphllm/passes/quantization/)
and the loaders of pre-quantized checkpoints (graphllm/models/quantization/), so one kernel family
serves both. A linear computes y = x @ W^T (+ bias) with W: [N, K] (nn.Linear's layout) stored as
these tensors (the names they have under the linear's module path in a compiled graph):

    scheme  tensors                                                   W[n, k] =
    fp8     qweight float8_e4m3fn [N, K], weight_scale float32 [N]     qweight[n, k] * weight_scale[n]
            input_scale float32 [1] (static activation scale) or None (dynamic, one scale per row)
    int8    qweight int8 [N, K], weight_scale float32 [N]              qweight[n, k] * weight_scale[n]
    int4    qweight int32 [K/8, N], scales [K/G, N], zeros [K/G, N]     (q[k, n] - zeros[k//G, n]) * scales[k//G, n]
            (scales and zeros in the activation dtype; zeros hold whole numbers 0..15)

int4 packing is GPTQ's: word qweight[r, n] holds q[8r + j, n] in bits 4j..4j+3 (j = 0..7), as an
unsigned nibble 0..15. G is the group size along K (a divisor of K, a multiple of 8; G = K is one
group per output channel). fp8 activations are quantized per row (per token) with scale
max|x_row| / 448, or with the static input_scale; the product is accumulated in float32 and scaled
by input scale times weight scale.

Everything here is the CPU/reference path and the quantizers; the Triton kernels live beside it
(graphllm/kernels/fp8_matmul.py, int4_matmul.py) and are tested against these references.
"""

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # the largest finite float8_e4m3fn
INT4_PACK = 8  # nibbles per int32 word
MIN_SCALE = 1e-12  # an all-zero row or group gets this scale, not a division by zero


def correctly_rounded_div(x: torch.Tensor, divisor: float) -> torch.Tensor:
    """x / divisor correctly rounded: by a float32 tensor (dividing by a Python float multiplies by its
    reciprocal on CUDA, which rounds differently; graphllm/kernels/kv_quant.py measured it)."""
    return x / torch.full((), divisor, dtype=torch.float32, device=x.device)


# --- quantizers: float weight [N, K] -> the layout above -------------------------------------------

def quantize_fp8_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [N, K] -> (float8_e4m3fn [N, K], float32 scale [N]), one scale per output channel."""
    w = weight.float()
    scale = correctly_rounded_div(w.abs().amax(dim=1), FP8_MAX).clamp(min=MIN_SCALE)  # [N]
    return (w / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), scale


def quantize_int8_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [N, K] -> (int8 [N, K], float32 scale [N]), symmetric, one scale per output channel."""
    w = weight.float()
    scale = correctly_rounded_div(w.abs().amax(dim=1), 127.0).clamp(min=MIN_SCALE)  # [N]
    return torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8), scale


def quantize_int4_weight(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """weight [N, K] -> (qweight int32 [K/8, N], scales [K/G, N], zeros [K/G, N]), asymmetric min-max
    per group of G columns; scales and zeros in weight's dtype (the dequantized weight uses them so)."""
    n, k = weight.shape
    check_int4_shape(n, k, group_size)
    w = weight.float().reshape(n, k // group_size, group_size)  # [N, K/G, G]
    lo = w.amin(dim=2).clamp(max=0.0)
    hi = w.amax(dim=2).clamp(min=0.0)
    scales = correctly_rounded_div(hi - lo, 15.0).clamp(min=MIN_SCALE)  # [N, K/G]
    zeros = torch.round(-lo / scales).clamp(0, 15)
    scales, zeros = scales.to(weight.dtype), zeros.to(weight.dtype)  # what dequantization will use
    q = torch.round(w / scales.float()[:, :, None] + zeros.float()[:, :, None]).clamp(0, 15)
    return pack_int4(q.reshape(n, k).to(torch.int32).t()), scales.t().contiguous(), zeros.t().contiguous()


def check_int4_shape(n: int, k: int, group_size: int) -> None:
    """The shapes the int4 layout can hold; a ValueError naming the problem otherwise."""
    if group_size % INT4_PACK or k % group_size:
        raise ValueError(f"int4 group size {group_size} must be a multiple of {INT4_PACK} dividing "
                         f"the input width {k}")


# --- packing -------------------------------------------------------------------------------------

def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """q: integers 0..15, [K, N] -> int32 [K/8, N] (nibble j of word r is row 8r + j)."""
    k, n = q.shape
    nibbles = q.to(torch.int64).reshape(k // INT4_PACK, INT4_PACK, n)
    shifts = torch.arange(0, 32, 4, device=q.device, dtype=torch.int64)[None, :, None]
    words = (nibbles << shifts).sum(dim=1)  # [K/8, N] in 0 .. 2^32 - 1
    return (words - (words >= 2**31).to(torch.int64) * 2**32).to(torch.int32)


def unpack_int4(qweight: torch.Tensor) -> torch.Tensor:
    """int32 [K/8, N] -> int32 [K, N] with values 0..15."""
    rows, n = qweight.shape
    shifts = torch.arange(0, 32, 4, device=qweight.device, dtype=torch.int32)[None, :, None]
    return ((qweight[:, None, :] >> shifts) & 0xF).reshape(rows * INT4_PACK, n)


# --- dequantization and reference linears ----------------------------------------------------------

def dequantize_int4(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor) -> torch.Tensor:
    """The int4 layout -> float32 W [N, K]."""
    q = unpack_int4(qweight).float()  # [K, N]
    group_size = q.shape[0] // scales.shape[0]
    s = scales.float().repeat_interleave(group_size, dim=0)
    z = zeros.float().repeat_interleave(group_size, dim=0)
    return ((q - z) * s).t()


def dequantize_per_channel(weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """fp8 or int8 [N, K] with scale [N] -> float32 W [N, K]."""
    return weight.float() * weight_scale.float()[:, None]


def quantize_fp8_rows(x: torch.Tensor, input_scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., K] -> (float8 [..., K], float32 scale [..., 1]): per row, or the static input_scale."""
    xf = x.float()
    if input_scale is None:
        scale = correctly_rounded_div(xf.abs().amax(dim=-1, keepdim=True), FP8_MAX).clamp(min=MIN_SCALE)
    else:
        scale = input_scale.float().reshape([1] * x.dim()).expand(*x.shape[:-1], 1)
    return (xf / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), scale


def fp8_linear_reference(x, weight, weight_scale, input_scale=None, bias=None) -> torch.Tensor:
    """W8A8: x [M, K] quantized per row (or with input_scale), float32 product, in x's dtype."""
    xq, x_scale = quantize_fp8_rows(x, input_scale)
    return fp8_quantized_linear_reference(xq, x_scale, weight, weight_scale, bias, x.dtype)


def fp8_quantized_linear_reference(xq, x_scale, weight, weight_scale, bias, out_dtype) -> torch.Tensor:
    """The product half of fp8_linear_reference: xq float8 [M, K] with x_scale float32 [M, 1] -> [M, N]."""
    y = (xq.float() @ weight.float().t()) * x_scale * weight_scale.float()[None, :]
    return (y if bias is None else y + bias.float()).to(out_dtype)


def int8_linear_reference(x, weight, weight_scale, bias=None) -> torch.Tensor:
    """Weight-only int8: x [M, K] @ dequantized W^T in float32, in x's dtype."""
    y = (x.float() @ weight.float().t()) * weight_scale.float()[None, :]
    return (y if bias is None else y + bias.float()).to(x.dtype)


def int4_linear_reference(x, qweight, scales, zeros, bias=None) -> torch.Tensor:
    """Weight-only int4: x [M, K] @ dequantized W^T in float32, in x's dtype."""
    y = x.float() @ dequantize_int4(qweight, scales, zeros).t()
    return (y if bias is None else y + bias.float()).to(x.dtype)
