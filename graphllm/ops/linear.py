"""The linear layers of a step as one registered custom op, so decode batches can use skinny_matmul.

`torch.ops.graphllm.linear(x, weight, bias)` is what the `skinny_linear` pass puts in place of
`aten.linear` in graphs compiled for the GPU. It is opaque to Inductor, like the matmuls Inductor
hands to cuBLAS anyway, and decides per call, from shapes, which kernel runs:

- x on CUDA in float16/bfloat16, with a row count and weight shape where the kernel measured
  faster than cuBLAS (`beats_cublas`: one row against the attention projections, 2-8 rows against
  o_proj and gate_up and the 8B qkv and down, up to 16 rows against the vocabulary):
  graphllm/kernels/skinny_matmul.py, no split-K reduce kernel;
- anything else (prefill, large batches, down_proj, float32, CPU): F.linear, what aten.linear does.

Inside a CUDA graph the choice is made once, at capture. To run every linear on cuBLAS instead,
compile with `CompileConfig.skinny_linear=False` (`--no-skinny-linear`): the graph then keeps
aten.linear and never calls this op.

The `linear_prologue` pass then folds the op before a linear into it, so a decode layer runs
no norm or activation kernel of its own (graphllm/kernels/skinny_matmul.py's prologues):

    graphllm.rms_norm_linear(x, norm_weight, eps, weight, bias)          = linear(rms_norm(x))
    graphllm.add_rms_norm_linear(x, residual, norm_weight, eps, weight, bias)
                                          = (linear(rms_norm(x + residual)), x + residual)

(the two norm ops take a last unit_offset argument, Gemma's 1 + weight, as graphllm.rms_norm does)
    graphllm.silu_and_mul_linear(x, weight, bias)                        = linear(silu_and_mul(x))
    graphllm.gelu_tanh_and_mul_linear(x, weight, bias)                   = linear(gelu_tanh_and_mul(x))

One row on CUDA in float16/bfloat16 is one skinny_matmul launch (`takes_fused_kernel`,
`takes_act_prologue`); anything else runs the two ops (graphllm's row kernels on CUDA, the references elsewhere) and
then `linear` above. `CompileConfig.linear_prologue=False` (`--no-linear-prologue`) leaves the norms
and SwiGLU as ops of their own.
"""

import torch
import torch.nn.functional as F

HALF_DTYPES = (torch.float16, torch.bfloat16)


def takes_kernel(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    if not (x.is_cuda and x.dtype in HALF_DTYPES and weight.dtype == x.dtype
            and weight.is_contiguous() and x.shape[-1] % 8 == 0 and (bias is None or bias.dtype == x.dtype)):
        return False
    from graphllm.kernels.skinny_matmul import beats_cublas
    rows = x.numel() // x.shape[-1]
    return rows > 0 and beats_cublas(rows, *weight.shape)


@torch.library.custom_op("graphllm::linear", mutates_args=())
def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x: [..., K], weight: [N, K], bias: [N] or None -> a new [..., N] in x's dtype (= F.linear)."""
    if takes_kernel(x, weight, bias):
        from graphllm.kernels.skinny_matmul import skinny_matmul
        return skinny_matmul(_rows(x), weight, bias).view(*x.shape[:-1], weight.shape[0])
    return F.linear(x, weight, bias)


@linear.register_fake
def _(x, weight, bias=None):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def takes_fused_kernel(x: torch.Tensor, weight: torch.Tensor, *others: torch.Tensor | None) -> bool:
    """One skinny_matmul launch with a norm prologue: one row (a batch-1 decode step) in half precision on
    CUDA. From two rows up the norm prologue made the kernel slower than the two launches it replaces
    (kernel_sweep prologue, H200: gate_up at 8 rows 95 us against 59), so those stay apart (the
    activation prologue's rule is takes_act_prologue's)."""
    return x.numel() == x.shape[-1] and _half_on_cuda(x, weight, *others)


def _half_on_cuda(x: torch.Tensor, weight: torch.Tensor, *others: torch.Tensor | None) -> bool:
    """What skinny_matmul's fused launches take: x in half precision on CUDA with K a multiple of 8, a contiguous
    weight and the other operands in x's dtype on its device."""
    same = all(t is None or (t.dtype == x.dtype and t.device == x.device) for t in (weight, *others))
    return x.is_cuda and x.dtype in HALF_DTYPES and same and weight.is_contiguous() and x.shape[-1] % 8 == 0


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as [rows, last dim] with a dense last dim (a view when possible)."""
    rows = x.reshape(-1, x.shape[-1])
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def _rms_norm(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, residual: torch.Tensor | None,
              unit_offset: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(rms_norm(h), h or None), h = x (+ residual): graphllm's row kernel on CUDA, else the reference."""
    if x.is_cuda:
        from graphllm.kernels.rms_norm import rms_norm as rms_norm_kernel
        out, h = rms_norm_kernel(_rows(x), norm_weight, eps, None if residual is None else _rows(residual),
                                 unit_offset=unit_offset)
        return out.view(x.shape), None if h is None else h.view(x.shape)
    from graphllm.kernels.reference import reference_rms_norm
    h = x if residual is None else x + residual
    return reference_rms_norm(h, norm_weight, eps, unit_offset), None if residual is None else h


@torch.library.custom_op("graphllm::rms_norm_linear", mutates_args=())
def rms_norm_linear(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor,
                    bias: torch.Tensor | None = None, unit_offset: bool = False) -> torch.Tensor:
    """linear(rms_norm(x, norm_weight, eps, unit_offset), weight, bias); x: [..., K] -> a new [..., N]."""
    if takes_fused_kernel(x, weight, norm_weight, bias):
        from graphllm.kernels.skinny_matmul import rms_norm_matmul
        out, _ = rms_norm_matmul(_rows(x), norm_weight, eps, weight, bias, unit_offset=unit_offset)
        return out.view(*x.shape[:-1], weight.shape[0])
    return linear(_rms_norm(x, norm_weight, eps, None, unit_offset)[0], weight, bias)


@rms_norm_linear.register_fake
def _(x, norm_weight, eps, weight, bias=None, unit_offset=False):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@torch.library.custom_op("graphllm::add_rms_norm_linear", mutates_args=())
def add_rms_norm_linear(x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                        weight: torch.Tensor, bias: torch.Tensor | None = None,
                        unit_offset: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """h = x + residual; (linear(rms_norm(h, norm_weight, eps, unit_offset), weight, bias), h) as new tensors."""
    if takes_fused_kernel(x, weight, residual, norm_weight, bias) and residual.shape == x.shape:
        from graphllm.kernels.skinny_matmul import rms_norm_matmul
        out, h = rms_norm_matmul(_rows(x), norm_weight, eps, weight, bias, residual=_rows(residual),
                                 unit_offset=unit_offset)
        return out.view(*x.shape[:-1], weight.shape[0]), h.view(x.shape)
    normed, h = _rms_norm(x, norm_weight, eps, residual, unit_offset)
    return linear(normed, weight, bias), h.contiguous()


@add_rms_norm_linear.register_fake
def _(x, residual, norm_weight, eps, weight, bias=None, unit_offset=False):
    return x.new_empty((*x.shape[:-1], weight.shape[0])), x.new_empty(x.shape)


# The shared_norm_prologue pass's op: a norm whose output a linear and other ops read (a MoE layer's post-attention
# norm, read by the router and by the experts) folds into that linear, whose one-row launch also stores the output:
#     graphllm.add_rms_norm_linear_normed(x, residual, norm_weight, eps, weight, bias, unit_offset)
#                                      = (linear(y), h, y), h = x + residual, y = rms_norm(h, norm_weight, eps)
@torch.library.custom_op("graphllm::add_rms_norm_linear_normed", mutates_args=())
def add_rms_norm_linear_normed(x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                               weight: torch.Tensor, bias: torch.Tensor | None = None,
                               unit_offset: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(linear(y, weight, bias), h, y) as new tensors: h = x + residual, y = rms_norm(h, norm_weight, eps,
    unit_offset). One row on CUDA in half precision: one skinny_matmul launch (rms_norm_matmul_normed); else the
    norm, then linear."""
    if takes_fused_kernel(x, weight, residual, norm_weight, bias) and residual.shape == x.shape:
        from graphllm.kernels.skinny_matmul import rms_norm_matmul_normed
        out, h, y = rms_norm_matmul_normed(_rows(x), norm_weight, eps, weight, bias, residual=_rows(residual),
                                           unit_offset=unit_offset)
        return out.view(*x.shape[:-1], weight.shape[0]), h.view(x.shape), y.view(x.shape)
    normed, h = _rms_norm(x, norm_weight, eps, residual, unit_offset)
    return linear(normed, weight, bias), h.contiguous(), normed.contiguous()


@add_rms_norm_linear_normed.register_fake
def _(x, residual, norm_weight, eps, weight, bias=None, unit_offset=False):
    return x.new_empty((*x.shape[:-1], weight.shape[0])), x.new_empty(x.shape), x.new_empty(x.shape)


def takes_act_prologue(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """silu_mul_matmul (SwiGLU or GeGLU in down_proj's prologue), in half precision on CUDA: where
    skinny_matmul.fuses_activation says (one row; at 2-8 rows it measured slower than the two launches)."""
    if not _half_on_cuda(x, weight, bias):
        return False
    from graphllm.kernels.skinny_matmul import fuses_activation
    rows = x.numel() // x.shape[-1]
    return rows > 0 and fuses_activation(rows, *weight.shape)


def _act_and_mul_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, gelu: bool) -> torch.Tensor:
    """linear(act(x[..., :K]) * x[..., K:], weight, bias), act silu or (gelu) tanh-approximated GELU."""
    if takes_act_prologue(x, weight, bias):
        from graphllm.kernels.skinny_matmul import silu_mul_matmul
        return silu_mul_matmul(_rows(x), weight, bias, gelu=gelu).view(*x.shape[:-1], weight.shape[0])
    return linear(_act_and_mul(x, gelu), weight, bias)


def _act_and_mul(x: torch.Tensor, gelu: bool, interleaved: bool = False) -> torch.Tensor:
    """act(x[..., :K]) * x[..., K:] (silu, or tanh-approximated GELU): graphllm's row kernel on CUDA, else the
    reference. interleaved: gate x[..., 0::2], up x[..., 1::2] (a product over an interleave_gate_up weight)."""
    if x.is_cuda:
        from graphllm.kernels.silu_and_mul import silu_and_mul as act_and_mul_kernel
        return act_and_mul_kernel(_rows(x), gelu=gelu, interleaved=interleaved).view(*x.shape[:-1], x.shape[-1] // 2)
    from graphllm.kernels.reference import reference_gelu_tanh_and_mul, reference_silu_and_mul
    if interleaved:
        x = torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)
    return (reference_gelu_tanh_and_mul if gelu else reference_silu_and_mul)(x)


@torch.library.custom_op("graphllm::silu_and_mul_linear", mutates_args=())
def silu_and_mul_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """linear(silu(x[..., :K]) * x[..., K:], weight, bias); x: [..., 2K], weight: [N, K] -> a new [..., N]."""
    return _act_and_mul_linear(x, weight, bias, gelu=False)


@torch.library.custom_op("graphllm::gelu_tanh_and_mul_linear", mutates_args=())
def gelu_tanh_and_mul_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """linear(gelu(x[..., :K], approximate="tanh") * x[..., K:], weight, bias): Gemma's GeGLU before down_proj."""
    return _act_and_mul_linear(x, weight, bias, gelu=True)


@gelu_tanh_and_mul_linear.register_fake
def _(x, weight, bias=None):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@silu_and_mul_linear.register_fake
def _(x, weight, bias=None):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


# The linear_epilogue pass's ops: the SwiGLU (or GeGLU) after gate_up folds into gate_up's own launch, whose
# weight is [gate; up] (fuse_gate_up), or with interleaved its rows gate 0, up 0, gate 1, ...
# (skinny_matmul.interleave_gate_up, the bias too), so that down_proj reads the activation and no [rows, 2I]
# tensor or silu_and_mul launch sits between them:
#     graphllm.linear_act_and_mul(x, weight, bias, gelu, interleaved)        = act_and_mul(linear(x, weight, bias))
#     graphllm.add_rms_norm_linear_act_and_mul(x, residual, norm_weight, eps, weight, bias, unit_offset, gelu,
#                                              interleaved)
#                                      = (act_and_mul(linear(rms_norm(x + residual), weight, bias)), x + residual)
# (act: silu, or with gelu tanh-approximated GELU, over the product's two halves or, interleaved, its column
# pairs.) On CUDA in half precision one skinny_matmul launch (matmul_act_mul) where the plain product takes the
# kernel (beats_cublas over the whole weight) or at one row; anything else runs the ops above one after another.


def takes_act_mul_kernel(x: torch.Tensor, weight: torch.Tensor, *others: torch.Tensor | None) -> bool:
    """matmul_act_mul over [gate; up]: one row (as takes_fused_kernel), or the rows where the plain product runs
    skinny_matmul (takes_kernel), in half precision on CUDA with an even number of output features."""
    if weight.shape[0] % 2 or not _half_on_cuda(x, weight, *others):
        return False
    from graphllm.kernels.skinny_matmul import beats_cublas
    rows = x.numel() // x.shape[-1]
    return rows == 1 or (rows > 0 and beats_cublas(rows, *weight.shape))


@torch.library.custom_op("graphllm::linear_act_and_mul", mutates_args=())
def linear_act_and_mul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                       gelu: bool = False, interleaved: bool = False) -> torch.Tensor:
    """act(y[..., :N]) * y[..., N:] with y = linear(x, weight, bias), weight [2N, K] -> a new [..., N];
    interleaved: act(y[..., 0::2]) * y[..., 1::2]."""
    if takes_act_mul_kernel(x, weight, bias):
        from graphllm.kernels.skinny_matmul import matmul_act_mul
        out, _ = matmul_act_mul(_rows(x), weight, bias, gelu=gelu, interleaved=interleaved)
        return out.view(*x.shape[:-1], weight.shape[0] // 2)
    return _act_and_mul(linear(x, weight, bias), gelu, interleaved)


@linear_act_and_mul.register_fake
def _(x, weight, bias=None, gelu=False, interleaved=False):
    return x.new_empty((*x.shape[:-1], weight.shape[0] // 2))


@torch.library.custom_op("graphllm::add_rms_norm_linear_act_and_mul", mutates_args=())
def add_rms_norm_linear_act_and_mul(x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                                    weight: torch.Tensor, bias: torch.Tensor | None = None, unit_offset: bool = False,
                                    gelu: bool = False, interleaved: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """h = x + residual; (linear_act_and_mul(rms_norm(h, norm_weight, eps, unit_offset), weight, bias, gelu,
    interleaved), h)."""
    rows = x.numel() // x.shape[-1]
    if rows == 1 and residual.shape == x.shape and takes_act_mul_kernel(x, weight, residual, norm_weight, bias):
        from graphllm.kernels.skinny_matmul import matmul_act_mul
        out, h = matmul_act_mul(_rows(x), weight, bias, gelu=gelu, residual=_rows(residual), norm_weight=norm_weight,
                                eps=eps, unit_offset=unit_offset, interleaved=interleaved)
        return out.view(*x.shape[:-1], weight.shape[0] // 2), h.view(x.shape)
    normed, h = _rms_norm(x, norm_weight, eps, residual, unit_offset)
    return linear_act_and_mul(normed, weight, bias, gelu, interleaved), h.contiguous()


@add_rms_norm_linear_act_and_mul.register_fake
def _(x, residual, norm_weight, eps, weight, bias=None, unit_offset=False, gelu=False, interleaved=False):
    return x.new_empty((*x.shape[:-1], weight.shape[0] // 2)), x.new_empty(x.shape)


# The row_sumsq pass's ops: at 1-8 rows the product before an add_rms_norm_linear stores the norm's row statistics
# (skinny_matmul.row_sumsq_matmul), and the add_rms_norm_linear's prologue reads them instead of the norm's row
# kernel running between the two products (2-8 rows) or of reading the row whole first (one row):
#     y, sumsq = graphllm.linear_row_sumsq(x, weight, bias, residual, rows, act)
#                                  = (linear(x, weight, bias), the 16-column sums of (y + residual)^2), act 0;
#                                    act 1 / 2: silu_and_mul_linear / gelu_tanh_and_mul_linear's product
#     graphllm.add_rms_norm_linear_sumsq(x, residual, sumsq, norm_weight, eps, weight, bias, unit_offset, rows)
#                                  = add_rms_norm_linear(x, residual, norm_weight, eps, weight, bias, unit_offset)
# rows is a bit mask of the row counts where both products run skinny_matmul (skinny_matmul.takes_row_sumsq over
# the two weights' shapes, fixed at compile time). Both ops take the kernel path at exactly those row counts in half
# precision on CUDA (row_sumsq_active, the same test on the same rows, dtype and device); elsewhere they are the ops
# they stand for, sumsq is left unwritten and the second op does not read it.
ACTS = (None, False, True)  # linear_row_sumsq's act -> _act_and_mul's gelu (0: no activation)


def row_sumsq_active(x: torch.Tensor, rows: int) -> bool:
    """Whether linear_row_sumsq and add_rms_norm_linear_sumsq take their kernels for x's rows: a row count in the
    bit mask `rows`, in half precision on CUDA."""
    m = x.numel() // x.shape[-1] if x.shape[-1] else 0
    return x.is_cuda and x.dtype in HALF_DTYPES and 0 < m < 64 and bool(rows >> m & 1)


@torch.library.custom_op("graphllm::linear_row_sumsq", mutates_args=())
def linear_row_sumsq(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor,
                     rows: int, act: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, sumsq): y = linear(x, weight, bias), or with act 1 / 2 silu_and_mul_linear / gelu_tanh_and_mul_linear's
    product; sumsq: [..., N // 16] float32, the sums of h^2 over each 16 columns of h = y + residual (rounded to
    x's dtype), written only where row_sumsq_active(x, rows)."""
    n = weight.shape[0]
    sumsq = x.new_empty((*x.shape[:-1], n // 16), dtype=torch.float32)
    if row_sumsq_active(x, rows):
        from graphllm.kernels.skinny_matmul import row_sumsq_matmul
        if act and not takes_act_prologue(x, weight, bias):  # 2-8 rows: silu_and_mul's row kernel first
            x, act = _act_and_mul(x, ACTS[act]), 0
        y, _ = row_sumsq_matmul(_rows(x), weight, _rows(residual), bias, act=("none", "silu", "gelu")[act],
                                sumsq=sumsq.view(-1, n // 16))
        return y.view(*x.shape[:-1], n), sumsq
    y = linear(x, weight, bias) if act == 0 else _act_and_mul_linear(x, weight, bias, gelu=ACTS[act])
    return y, sumsq


@linear_row_sumsq.register_fake
def _(x, weight, bias, residual, rows, act=0):
    n = weight.shape[0]
    return x.new_empty((*x.shape[:-1], n)), x.new_empty((*x.shape[:-1], n // 16), dtype=torch.float32)


@torch.library.custom_op("graphllm::add_rms_norm_linear_sumsq", mutates_args=())
def add_rms_norm_linear_sumsq(x: torch.Tensor, residual: torch.Tensor, sumsq: torch.Tensor, norm_weight: torch.Tensor,
                              eps: float, weight: torch.Tensor, bias: torch.Tensor | None = None,
                              unit_offset: bool = False, rows: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """add_rms_norm_linear(x, residual, norm_weight, eps, weight, bias, unit_offset); where row_sumsq_active(x,
    rows), the norm's statistics come from sumsq (linear_row_sumsq's, for h = x + residual)."""
    if row_sumsq_active(x, rows):
        from graphllm.kernels.skinny_matmul import rms_norm_matmul
        out, h = rms_norm_matmul(_rows(x), norm_weight, eps, weight, bias, residual=_rows(residual),
                                 unit_offset=unit_offset, sumsq=sumsq.view(-1, sumsq.shape[-1]))
        return out.view(*x.shape[:-1], weight.shape[0]), h.view(x.shape)
    return add_rms_norm_linear(x, residual, norm_weight, eps, weight, bias, unit_offset)


@add_rms_norm_linear_sumsq.register_fake
def _(x, residual, sumsq, norm_weight, eps, weight, bias=None, unit_offset=False, rows=0):
    return x.new_empty((*x.shape[:-1], weight.shape[0])), x.new_empty(x.shape)
