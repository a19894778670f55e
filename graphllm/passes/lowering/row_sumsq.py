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

int4 (no int4 prologue: the norm is its own add_rms_norm between two int4 linears) the norm's work splits between
the two products (graphllm/ops/quantized_linear.py's pair; counted as "int4"):

    o = graphllm.int4_linear.default(attn, qw_o, s_o, z_o)
    n = graphllm.add_rms_norm.default(h, o, w_norm, eps)
    gate_up = graphllm.int4_linear.default(getitem(n, 0), qw, s, z)      # or int4_linear_act_and_mul(..., gelu, True)
->
    p = graphllm.int4_linear_add_norm.default(attn, qw_o, s_o, z_o, None, h, w_norm, eps, False)
    gate_up = graphllm.int4_norm_linear.default(getitem(p, 0), getitem(p, 2), eps, qw, s, z, None, 0)   # act 1 / 2
    (getitem(n, 1), the new residual, -> getitem(p, 1))

Up to 16 rows, o_proj's (down's) split-K finish adds the residual, multiplies by the norm's weight and stores the sums
of squares; gate_up (the next layer's qkv) scales its sums by each row's 1 / rms. No norm kernel runs, and the norm's
row reduction happens in the finish of a product that is already running. Past 16 rows the norm's row kernel runs
between the two products as before (graphllm/ops/quantized_linear.py). Only where the normed output feeds one
int4 linear, the product is read only by the add, and the dtypes agree.
"""

import operator

import torch
from torch import fx

import graphllm.ops.linear  # noqa: F401  (registers the ops)
import graphllm.ops.quantized_linear  # noqa: F401  (and the int4 pair's)
from graphllm.ir.graph import StepGraph, new_node
from graphllm.passes.base import GraphPass, source_uuid
from graphllm.passes.lowering.linear_prologue import _call

ops = torch.ops.graphllm

# the product's op -> linear_row_sumsq's act
PRODUCTS = {ops.linear.default: 0, ops.silu_and_mul_linear.default: 1, ops.gelu_tanh_and_mul_linear.default: 2}


def _dtype(node) -> torch.dtype | None:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return val.dtype if isinstance(val, torch.Tensor) else None


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
    """Pairs a product with the add_rms_norm_linear after it; counts the pairs by the product's activation, and the
    int4 pairs (an add_rms_norm between two int4 linears) as "int4"."""

    name = "row_sumsq"
    version = 2  # 2: int4 pairs

    devices = ("cuda",)

    def __init__(self, int4_only: bool = False):
        self.int4_only = int4_only  # only the int4 pairs (the default's: measured faster only there)

    def uuid(self) -> str:
        return source_uuid(type(self).__module__, f"{self.name}:{self.version}:int4_only={self.int4_only}")

    def apply(self, graph: StepGraph) -> dict[str, int]:
        counts = {"none": 0, "silu": 0, "gelu": 0}
        g = graph.graph
        norms = [] if self.int4_only else [n for n in g.nodes if _call(n, ops.add_rms_norm_linear.default)]
        for norm in norms:
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
        counts["int4"] = self._int4_pairs(g)
        return counts

    @staticmethod
    def _int4_pairs(g: fx.Graph) -> int:
        """o = int4_linear(a, ...) read only by add_rms_norm(o, r) (either side) whose normed output only an int4
        linear reads (int4_linear, or linear_epilogue's int4_linear_act_and_mul) -> int4_linear_add_norm and
        int4_norm_linear; the norm's residual output becomes the new op's h."""
        consumers = (ops.int4_linear.default, ops.int4_linear_act_and_mul.default)
        pairs = 0
        for norm in [n for n in g.nodes if _call(n, ops.add_rms_norm.default)]:
            x, residual, norm_weight, eps, *rest = norm.args
            getitems = list(norm.users)
            if not all(_call(u, operator.getitem) for u in getitems):
                continue
            normed = [u for u in getitems if u.args[1] == 0]
            if len(normed) != 1 or len(normed[0].users) != 1:
                continue
            (consumer,) = normed[0].users
            if consumer.target not in consumers or consumer.kwargs or consumer.args[0] is not normed[0]:
                continue
            if consumer.target == ops.int4_linear_act_and_mul.default and not consumer.args[6]:
                continue  # halves, not pairs: the GEMV's epilogue reads pairs
            product = next((p for p in (x, residual) if _call(p, ops.int4_linear.default) and len(p.users) == 1), None)
            if product is None or _dtype(product) != _dtype(normed[0]) or _dtype(x) != _dtype(residual):
                continue
            stream = residual if product is x else x
            a, qweight, scales, zeros, *b = product.args
            unit_offset = bool(rest[0]) if rest else False
            act = 0
            if consumer.target == ops.int4_linear_act_and_mul.default:
                act = 2 if consumer.args[5] else 1
            _, cq, cs, cz, *cb = consumer.args
            with g.inserting_before(norm):
                fused = new_node(g, ops.int4_linear_add_norm.default,
                                 (a, qweight, scales, zeros, b[0] if b else None, stream, norm_weight, eps,
                                  unit_offset),
                                 norm)
                xn, h, sumsq = (new_node(g, operator.getitem, (fused, i), norm) for i in range(3))
            for node in (xn, h):  # xn and h have the normed output's shape and dtype (the checks above)
                node.meta.setdefault("val", normed[0].meta.get("val"))
            with g.inserting_before(consumer):
                new = new_node(g, ops.int4_norm_linear.default,
                               (xn, sumsq, eps, cq, cs, cz, cb[0] if cb else None, act), consumer)
            consumer.replace_all_uses_with(new)
            g.erase_node(consumer)
            for u in getitems:
                if u.args[1] == 1:
                    u.replace_all_uses_with(h)
                g.erase_node(u)
            g.erase_node(norm)
            g.erase_node(product)
            pairs += 1
        return pairs
