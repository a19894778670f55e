"""LinearPrologue: norms and SwiGLU fold into the graphllm.linear they feed; same logits and KV writes."""

import pytest
import torch

from graphllm.kernels.reference import reference_gelu_tanh_and_mul, reference_rms_norm, reference_silu_and_mul
from graphllm.ops.linear import add_rms_norm_linear, gelu_tanh_and_mul_linear, rms_norm_linear, silu_and_mul_linear
from graphllm.passes.fusion.fuse_add_rmsnorm import FuseAddRMSNorm
from graphllm.passes.fusion.fuse_gate_up import FuseGateUp
from graphllm.passes.fusion.fuse_qkv import FuseQKV
from graphllm.passes.fusion.fuse_silu_mul import FuseSiluMul
from graphllm.passes.lowering.linear_prologue import LinearPrologue
from graphllm.passes.lowering.skinny_linear import SkinnyLinear
from graphllm.passes.utility.dce import DeadCodeElimination
from graphllm.passes.utility.eliminate_noops import EliminateNoops
from graphllm.passes.manager import PassManager
from tests.passes.harness import assert_same_function, copy_graph, tiny_step_graph

ops = torch.ops.graphllm


def prepared(arch: str):
    """The tiny graph as the pass manager hands it over: fused, then on graphllm.linear (forced on CPU)."""
    graph, config = tiny_step_graph(arch)
    for p in (EliminateNoops(), FuseQKV(), FuseGateUp(), FuseSiluMul(), FuseAddRMSNorm(),
              SkinnyLinear()):
        p(graph)
    return graph, config


def targets(graph) -> list:
    return [n.target for n in graph.graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize("arch", ("llama", "qwen2", "qwen3"))  # qwen2: qkv bias; qwen3: q/k norms that stay
def test_same_function_when_forced_on_cpu(arch):
    before, config = prepared(arch)
    after = copy_graph(before)
    counts = LinearPrologue()(after)
    DeadCodeElimination()(after)
    layers = config.num_hidden_layers
    # every layer's post-attention norm and the input norms after the first; the first layer's input
    # norm has no residual yet; the final norm reaches lm_head through the row gather and stays
    assert counts == {"add_rms_norm": 2 * layers - 1, "rms_norm": 1, "silu_and_mul": layers,
                      "gelu_tanh_and_mul": 0}
    found = targets(after)
    assert found.count(ops.linear.default) == 1 + layers  # lm_head and each o_proj keep the plain op
    assert ops.silu_and_mul.default not in found and found.count(ops.add_rms_norm.default) == 1
    assert_same_function(before, after, config, seeds=(1, 2))


@pytest.mark.parametrize("arch", ("gemma2", "gemma3"))
def test_gemma_pre_norms_fold_with_their_unit_offset(arch):
    """Gemma's norms (1 + weight, fuse_add_rmsnorm's unit_offset) fold like RMSNorm's, the flag after the bias;
    its post-norms read attention's and the MLP's outputs, not a linear's input, and stay. Its GeGLU folds into
    down_proj."""
    before, config = prepared(arch)
    after = copy_graph(before)
    counts = LinearPrologue()(after)
    DeadCodeElimination()(after)
    layers = config.num_hidden_layers
    assert counts == {"add_rms_norm": 2 * layers - 1, "rms_norm": 1, "silu_and_mul": 0,
                      "gelu_tanh_and_mul": layers}
    fused = [n for n in after.graph.nodes if n.target in (ops.rms_norm_linear.default, ops.add_rms_norm_linear.default)]
    assert len(fused) == 2 * layers and all(n.args[-1] is True and n.args[-2] is None for n in fused)
    assert_same_function(before, after, config, seeds=(1, 2))


def test_cpu_graph_is_left_alone():
    graph, _ = prepared("llama")
    code = graph.gm.code
    report = PassManager.run_one(LinearPrologue(), graph)  # the manager reads the pass's devices
    assert report.counts == {} and report.skipped == "for cuda graphs, this one is cpu"
    assert graph.gm.code == code


def test_a_norm_read_elsewhere_stays():
    """An rms_norm output that another node also reads cannot move inside the matmul."""
    g = torch.fx.Graph()
    x, nw, w = g.placeholder("x"), g.placeholder("nw"), g.placeholder("w")
    y = g.call_function(ops.rms_norm.default, (x, nw, 1e-6))
    lin = g.call_function(ops.linear.default, (y, w))
    g.output((lin, y))
    from graphllm.passes.lowering.linear_prologue import _fold_single
    assert not _fold_single(g, lin, ops.rms_norm.default, ops.rms_norm_linear.default, 3)


def test_ops_equal_their_parts_off_the_kernel_path():
    """CPU (and rows > 16 on CUDA) run the two ops one after the other: exactly the unfused result."""
    gen = torch.Generator().manual_seed(0)
    x, r = torch.randn(20, 3, 32, generator=gen), torch.randn(20, 3, 32, generator=gen)
    nw, w, b = torch.randn(32, generator=gen), torch.randn(48, 32, generator=gen), torch.randn(48, generator=gen)
    linear = torch.nn.functional.linear
    torch.testing.assert_close(rms_norm_linear(x, nw, 1e-5, w, b), linear(reference_rms_norm(x, nw, 1e-5), w, b),
                               rtol=0, atol=0)
    out, h = add_rms_norm_linear(x, r, nw, 1e-5, w)
    assert torch.equal(h, x + r) and torch.equal(out, linear(reference_rms_norm(x + r, nw, 1e-5), w))
    gemma = (reference_rms_norm(x + r, nw, 1e-5, unit_offset=True))
    out, h = add_rms_norm_linear(x, r, nw, 1e-5, w, None, True)
    assert torch.equal(out, linear(gemma, w)) and not torch.equal(out, linear(reference_rms_norm(x + r, nw, 1e-5), w))
    gate_up = torch.randn(20, 64, generator=gen)
    assert torch.equal(silu_and_mul_linear(gate_up, w), linear(reference_silu_and_mul(gate_up), w))
    assert torch.equal(gelu_tanh_and_mul_linear(gate_up, w), linear(reference_gelu_tanh_and_mul(gate_up), w))


def quantized_pair(arch: str, quantize, late=(), **switch):
    """(before, after, config, act): the tiny graph quantized by `quantize`, fused and on graphllm.linear, with
    LinearPrologue() on before (which leaves the quantized linears alone) and LinearPrologue(**switch) on after
    (which folds every norm and activation but the final norm), then `late` and DCE on both."""
    graph, config = tiny_step_graph(arch)
    quantize(graph)
    for p in (EliminateNoops(), FuseQKV(), FuseGateUp(), FuseSiluMul(), FuseAddRMSNorm(), SkinnyLinear()):
        p(graph)
    before, after = copy_graph(graph), copy_graph(graph)
    assert LinearPrologue()(before)["add_rms_norm"] == 0  # quantized linears are left alone unless asked
    counts = LinearPrologue(**switch)(after)
    for g in (before, after):
        for p in late:
            p(g)
        DeadCodeElimination()(g)
    layers = config.num_hidden_layers
    act = "gelu_tanh_and_mul" if arch == "gemma2" else "silu_and_mul"
    assert counts["add_rms_norm"] == 2 * layers - 1 and counts["rms_norm"] == 1 and counts[act] == layers
    return before, after, config, act


def assert_fused(before, after, config, act: str, scheme: str) -> None:
    """after holds the scheme's fused ops where the prologues were, computes what before does (CPU: every fused op
    runs its parts), and the manifest's kernel plan names its shapes as before's."""
    layers, found = config.num_hidden_layers, targets(after)
    assert found.count(getattr(ops, f"{scheme}_add_rms_norm_linear").default) == 2 * layers - 1
    assert found.count(getattr(ops, f"{scheme}_rms_norm_linear").default) == 1
    assert found.count(getattr(ops, f"{scheme}_{act}_linear").default) == layers
    assert_same_function(before, after, config, seeds=(1, 2), atol=0.0)
    from graphllm.compiler.pipeline import kernel_plan
    assert kernel_plan(after, (1,)).keys() == kernel_plan(before, (1,)).keys() and len(kernel_plan(after, (1,))) == 4


@pytest.mark.parametrize("arch", ("llama", "gemma2"))  # gemma2: unit_offset norms and GeGLU
def test_fp8_linears_take_the_prologues_when_asked(arch):
    """fp8=True: norms and activations fold into the fp8 linears too, before quantize_fp8_activations splits the
    rest (o_proj); the step computes exactly what the split graph does (CPU: every op runs its parts)."""
    from graphllm.passes.quantization.quantize_fp8 import QuantizeFP8
    from graphllm.passes.quantization.quantize_fp8_activations import QuantizeFP8Activations
    before, after, config, act = quantized_pair(arch, QuantizeFP8(), (QuantizeFP8Activations(),), fp8=True)
    found = targets(after)
    assert found.count(ops.fp8_linear_quantized.default) == config.num_hidden_layers  # o_proj, quantized on its own
    assert ops.silu_and_mul_fp8.default not in found  # llama's SwiGLU: the split graph's silu_and_mul_fp8
    assert (ops.silu_and_mul_fp8.default in targets(before)) == (arch == "llama")
    assert_fused(before, after, config, act, "fp8")


def test_fp8_ops_equal_their_parts_off_the_kernel_path():
    from graphllm.kernels.quant_layout import fp8_linear_reference, quantize_fp8_weight
    gen = torch.Generator().manual_seed(1)
    x, r = torch.randn(5, 32, generator=gen), torch.randn(5, 32, generator=gen)
    nw, b = torch.randn(32, generator=gen), torch.randn(48, generator=gen)
    w8, ws = quantize_fp8_weight(torch.randn(48, 32, generator=gen) / 6)
    scale = torch.tensor([0.01])
    assert torch.equal(ops.fp8_rms_norm_linear(x, nw, 1e-5, w8, ws, None, b),
                       fp8_linear_reference(reference_rms_norm(x, nw, 1e-5), w8, ws, None, b))
    out, h = ops.fp8_add_rms_norm_linear(x, r, nw, 1e-5, w8, ws, scale, None, True)
    assert torch.equal(h, x + r)
    assert torch.equal(out, fp8_linear_reference(reference_rms_norm(x + r, nw, 1e-5, True), w8, ws, scale))
    gate_up = torch.randn(5, 64, generator=gen)
    assert torch.equal(ops.fp8_silu_and_mul_linear(gate_up, w8, ws),
                       fp8_linear_reference(reference_silu_and_mul(gate_up), w8, ws))
    assert torch.equal(ops.fp8_gelu_tanh_and_mul_linear(gate_up, w8, ws, scale, b),
                       fp8_linear_reference(reference_gelu_tanh_and_mul(gate_up), w8, ws, scale, b))


def test_the_fp8_switch_is_in_the_pass_list_uuid():
    from graphllm.config import CompileConfig
    plain, fp8 = (PassManager(CompileConfig(quantization="fp8", fp8_linear_prologue=on)) for on in (False, True))
    assert plain.uuid() != fp8.uuid()
    assert next(p for p in fp8.passes if p.name == "linear_prologue").fp8
