"""Int4MMALayout: int4 linears read the tensor-core kernel's weight layout; the same function (CPU: the op's reference
path over the layout unshuffled), and linears it cannot take stay."""

import torch
from torch import fx

from graphllm.config import CompileConfig
from graphllm.ir.graph import StepGraph
from graphllm.kernels.quant_layout import int4_linear_reference, quantize_int4_weight
from graphllm.ops.quantized_linear import int4_mma_linear
from graphllm.passes.lowering.int4_mma_layout import Int4MMALayout
from graphllm.passes.manager import PassManager

ops = torch.ops.graphllm


def int4_graph(shapes: list[tuple[int, int, int]], shared: bool = False) -> StepGraph:
    """x -> int4_linear chain over weights [N, K] with group G each (shared: the first qweight read twice)."""
    gen = torch.Generator().manual_seed(0)
    root = torch.nn.Module()
    g = fx.Graph()
    y = g.placeholder("x")
    outputs = []
    for i, (n, k, group) in enumerate(shapes):
        for name, t in zip(("qweight", "scales", "zeros"), quantize_int4_weight(torch.randn(n, k, generator=gen), group)):
            root.register_parameter(f"{name}{i}", torch.nn.Parameter(t, requires_grad=False))
        args = [g.get_attr(f"{name}{i}") for name in ("qweight", "scales", "zeros")]
        y = g.call_function(ops.int4_linear.default, (y, *args))
        outputs.append(y)
        if shared and i == 0:
            outputs.append(g.call_function(ops.int4_linear.default, (g.placeholder("x2"), *args)))
    g.output(tuple(outputs))
    return StepGraph(fx.GraphModule(root, g), (), None)


def targets(graph: StepGraph) -> list:
    return [n.target for n in graph.graph.nodes if n.op == "call_function"]


def test_every_linear_that_tiles_moves_and_computes_the_same():
    graph = int4_graph([(256, 128, 128), (48, 256, 256), (32, 48, 16)])  # the last: K 48, group 16: kept
    x = torch.randn(3, 128, generator=torch.Generator().manual_seed(1))
    before = graph.gm(x)
    assert Int4MMALayout().apply(graph) == {"linears": 2, "kept": 1}
    graph.recompile()
    assert targets(graph).count(ops.int4_mma_linear.default) == 2 and targets(graph).count(ops.int4_linear.default) == 1
    assert graph.drop_unused_weights() == 2  # the two GPTQ qweights; the words hold the same bytes
    graph.recompile()
    words = [p for name, p in graph.gm.named_parameters() if name.endswith("_mma")]
    assert [w.shape for w in words] == [(16, 1, 32, 8), (3, 2, 32, 8)]
    after = graph.gm(x)
    for a, b in zip(before, after):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


def test_a_shared_qweight_stays():
    graph = int4_graph([(32, 128, 128)], shared=True)
    assert Int4MMALayout().apply(graph) == {"linears": 0, "kept": 2}


def test_the_op_off_the_gpu_is_the_int4_linear():
    from graphllm.kernels.int4_mma import shuffle_int4_mma
    qweight, scales, zeros = quantize_int4_weight(torch.randn(64, 256, generator=torch.Generator().manual_seed(2)), 128)
    x, bias = torch.randn(2, 5, 256), torch.randn(64)
    got = int4_mma_linear(x, shuffle_int4_mma(qweight), scales, zeros, bias)
    assert got.shape == (2, 5, 64)
    torch.testing.assert_close(got.view(10, 64), int4_linear_reference(x.view(10, 256), qweight, scales, zeros, bias))


def test_the_switch_runs_the_pass_last_and_turns_the_int4_folds_off():
    names = [p.name for p in PassManager(CompileConfig(quantization="int4", int4_mma=True)).passes]
    assert "int4_mma_layout" in names and "linear_epilogue" not in names and "row_sumsq" not in names
    assert names.index("int4_mma_layout") > names.index("linear_prologue")
    assert "int4_mma_layout" not in [p.name for p in PassManager(CompileConfig(quantization="int4")).passes]
    forced = [p.name for p in PassManager(CompileConfig(quantization="int4", int4_mma=True, row_sumsq=True)).passes]
    assert forced.index("row_sumsq") < forced.index("int4_mma_layout")
