"""RowSumsq: the product before an add_rms_norm_linear computes that norm's row statistics in its epilogue.

Runs after `linear_prologue` (and `linear_epilogue` when on) on GPU graphs. A norm in a product's prologue reads
its rows whole in every program before the weight stream (graphllm/kernels/skinny_matmul.py): at one row that is
the fused launch linear_prologue makes, at 2-8 rows it measured too slow, so add_rms_norm_linear runs the norm's row
kernel there, then the product. With this pass the product before it (o_proj, or down_proj with SwiGLU in its
prologue) adds the residual to each output tile it stores and stores the 16-column sums of squares of that sum; the
next product normalises each operand tile with them (skinny_matmul.takes_row_sumsq says where). At 2-8 rows a
decode layer then runs no norm kernel (the post-attention norm and the next layer's input norm go); at one row the
fused launches start their weight streams without first reading the rows. Before and after:

    o = graphllm.linear.default(attn, w_o)
    f = graphllm.add_rms_norm_linear.default(h, o, w_norm, eps, w_gate_up)
->
    p = graphllm.linear_row_sumsq.default(attn, w_o, None, h, rows, 0)
    o = getitem(p, 0)
    f = graphllm.add_rms_norm_linear_sumsq.default(h, o, getitem(p, 1), w_norm, eps, w_gate_up, None, False, rows)

    down = graphllm.silu_and_mul_linear.default(gate_up, w_down)                  # act 1 (GeGLU's: act 2)
    f = graphllm.add_rms_norm_linear.default(h, down, w_norm, eps, w_qkv)        # the next layer's input norm
->  the same with linear_row_sumsq(gate_up, w_down, None, h, rows, 1)

rows is the bit mask of the row counts where both products run skinny_matmul (skinny_matmul.takes_row_sumsq of the
two weights' shapes); if none, the pair is left alone. Either operand of the add may be the product; the product
must be read only there (its output is the norm's input, and the op's second output is the new residual). Biases
and a norm's unit_offset go along. fp8 linears and products whose weight shape is not known stay as they are.
"""

import operator

import torch
from torch import fx

import graphllm.ops.linear  # noqa: F401  (registers the ops)
from graphllm.ir.graph import StepGraph, new_node
from graphllm.passes.base import GraphPass
from graphllm.passes.lowering.linear_prologue import _call

ops = torch.ops.graphllm

# the product's op -> linear_row_sumsq's act
PRODUCTS = {ops.linear.default: 0, ops.silu_and_mul_linear.default: 1, ops.gelu_tanh_and_mul_linear.default: 2}


def _shape(node) -> tuple[int, ...] | None:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return tuple(val.shape) if isinstance(val, torch.Tensor) else None


def row_mask(before: tuple[int, ...] | None, after: tuple[int, ...] | None) -> int:
    """The rows bit mask for products of weight shapes before and after ([N, K], [N2, N]); 0 where not known."""
    if before is None or after is None or len(before) != 2 or len(after) != 2:
        return 0
    from graphllm.kernels.skinny_matmul import takes_row_sumsq  # Triton: imported where a GPU graph needs it
    return sum(1 << m for m in range(1, 9) if takes_row_sumsq(m, before, after))


class RowSumsq(GraphPass):
    """Pairs a product with the add_rms_norm_linear after it; counts the pairs by the product's activation."""

    name = "row_sumsq"
    version = 1

    devices = ("cuda",)

    def apply(self, graph: StepGraph) -> dict[str, int]:
        counts = {"none": 0, "silu": 0, "gelu": 0}
        g = graph.graph
        for norm in [n for n in g.nodes if _call(n, ops.add_rms_norm_linear.default)]:
            x, residual, norm_weight, eps, weight, *rest = norm.args
            for side, product in ((1, residual), (0, x)):
                if not (_call(product, ops.linear.default) or _call(product, ops.silu_and_mul_linear.default)
                        or _call(product, ops.gelu_tanh_and_mul_linear.default)) or len(product.users) != 1:
                    continue
                if not all(_call(u, operator.getitem) for u in norm.users):
                    continue
                operand, product_weight, *product_bias = product.args
                rows = row_mask(_shape(product_weight), _shape(weight))
                if not rows:
                    continue
                stream = norm.args[1 - side]
                act = PRODUCTS[product.target]
                with g.inserting_before(norm):
                    fused = new_node(g, ops.linear_row_sumsq.default,
                                     (operand, product_weight, product_bias[0] if product_bias else None, stream,
                                      rows, act), product)
                    y = new_node(g, operator.getitem, (fused, 0), product)
                    sumsq = new_node(g, operator.getitem, (fused, 1), product)
                    pair = (y, stream) if side == 0 else (stream, y)
                    bias = rest[0] if rest else None
                    unit_offset = bool(rest[1]) if len(rest) > 1 else False
                    new = new_node(g, ops.add_rms_norm_linear_sumsq.default,
                                   (*pair, sumsq, norm_weight, eps, weight, bias, unit_offset, rows), norm)
                norm.replace_all_uses_with(new)
                g.erase_node(norm)
                g.erase_node(product)
                counts[("none", "silu", "gelu")[act]] += 1
                break
        return counts
