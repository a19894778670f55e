"""Int4MMALayout (opt-in, `--int4-mma`): int4 linears read their weight in the tensor-core kernel's layout.

Runs last among the lowering passes on GPU graphs (after fuse_qkv / fuse_gate_up concatenated the packed weights).
Each int4_linear whose qweight is a get_attr of that linear alone, with N a multiple of 16 and K and the group size
multiples of 128, gets the words of kernels/int4_mma.py (shuffle_int4_mma: each thread's word is its mma.sync A
fragment) and becomes int4_mma_linear, which runs that kernel up to 16 rows and the dequantized weight with cuBLAS
past them (graphllm/ops/quantized_linear.py):

    qw: "i32[K/8, N]" = get_attr <p>.qweight
    y = graphllm.int4_linear.default(x, qw, s, z, b)
->  words: "i32[N/16, K/128, 32, 8]" = get_attr <p>.qweight_mma
    y = graphllm.int4_mma_linear.default(x, words, s, z, b)

The same bytes, another order; the same function (the kernels' roundings aside). The folded int4 ops
(int4_linear_act_and_mul, int4_linear_add_norm, int4_norm_linear) keep the GPTQ layout and the one-row GEMV, so
`--int4-mma` turns the int4 folds' default (linear_epilogue, row_sumsq) off. Not yet measured on a GPU (s44).
"""

import torch

import graphllm.ops.quantized_linear  # noqa: F401  (registers the ops)
from graphllm.ir.graph import StepGraph, attr_tensor, new_node
from graphllm.passes.base import GraphPass
from graphllm.passes.lowering.linear_prologue import _call

ops = torch.ops.graphllm


class Int4MMALayout(GraphPass):
    """Counts the linears moved to the MMA layout ("linears") and the int4 linears left ("kept")."""

    name = "int4_mma_layout"
    devices = ("cuda",)

    def apply(self, graph: StepGraph) -> dict[str, int]:
        from graphllm.kernels.int4_mma import CHUNK, shuffle_int4_mma  # Triton: imported where a graph needs it
        counts = {"linears": 0, "kept": 0}
        g = graph.graph
        for node in [n for n in g.nodes if _call(n, ops.int4_linear.default)]:
            x, qweight, scales, *rest = node.args
            if node.kwargs or qweight.op != "get_attr" or len(qweight.users) != 1:
                counts["kept"] += 1
                continue
            packed = attr_tensor(graph.gm, qweight)
            k, n = packed.shape[0] * 8, packed.shape[1]
            group = k // attr_tensor(graph.gm, scales).shape[0]
            if n % 16 or k % CHUNK or group % CHUNK:
                counts["kept"] += 1
                continue
            words = graph.add_weight(f"{qweight.target}_mma", shuffle_int4_mma(packed), node)
            with g.inserting_before(node):
                new = new_node(g, ops.int4_mma_linear.default, (x, words, scales, *rest), node)
            node.replace_all_uses_with(new)
            g.erase_node(node)
            counts["linears"] += 1
        return counts
