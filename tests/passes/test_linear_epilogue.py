"""LinearEpilogue: SwiGLU / GeGLU fold into the gate_up linear that feeds them; same logits and KV writes."""

import pytest
import torch

from graphllm.config import CompileConfig
from graphllm.kernels.reference import reference_gelu_tanh_and_mul, reference_rms_norm, reference_silu_and_mul
from graphllm.ops.linear import add_rms_norm_linear_act_and_mul, linear_act_and_mul
from graphllm.passes.lowering.linear_epilogue import LinearEpilogue
from graphllm.passes.lowering.linear_prologue import LinearPrologue
from graphllm.passes.manager import PassManager
from graphllm.passes.utility.dce import DeadCodeElimination
from tests.passes.harness import assert_same_function, copy_graph
from tests.passes.test_linear_prologue import prepared, targets

ops = torch.ops.graphllm


@pytest.mark.parametrize("arch", ("llama", "qwen2", "gemma2"))  # qwen2: biases elsewhere; gemma2: GeGLU, 1 + weight
def test_after_the_prologues_same_function(arch):
    """Every layer's gate_up takes the pre-MLP add_rms_norm in and the activation out; down_proj is a plain linear."""
    before, config = prepared(arch)
    LinearPrologue()(before)
    after = copy_graph(before)
    counts = LinearEpilogue()(after)
    DeadCodeElimination()(after)
    layers = config.num_hidden_layers
    assert counts == {"add_rms_norm": layers, "none": 0}
    found = targets(after)
    assert found.count(ops.add_rms_norm_linear_act_and_mul.default) == layers
    assert not {ops.silu_and_mul_linear.default, ops.gelu_tanh_and_mul_linear.default} & set(found)
    assert found.count(ops.linear.default) == 1 + 2 * layers  # lm_head, each o_proj and each down_proj
    gelu = arch == "gemma2"
    fused = [n for n in after.graph.nodes if n.target == ops.add_rms_norm_linear_act_and_mul.default]
    assert all(n.args[-2] is gelu and n.args[-3] is gelu for n in fused)  # GeGLU; Gemma's norm unit_offset
    assert all(n.args[-1] is True for n in fused)  # gate_up's rows interleaved
    assert_interleaved(before, after, fused)
    assert_same_function(before, after, config, seeds=(1, 2), atol=0.0)


def assert_interleaved(before, after, fused) -> None:
    """Each folded gate_up reads a new weight (and bias), the old one's rows gate 0, up 0, gate 1, ..."""
    from graphllm.ir.graph import attr_tensor
    old = before.weights
    for node in fused:
        weight = node.args[4] if node.target == ops.add_rms_norm_linear_act_and_mul.default else node.args[1]
        assert weight.target.endswith("_interleaved")
        w, w0 = attr_tensor(after.gm, weight), old[weight.target.removesuffix("_interleaved")]
        n = w0.shape[0] // 2
        assert torch.equal(w[0::2], w0[:n]) and torch.equal(w[1::2], w0[n:])
        assert weight.target.removesuffix("_interleaved") not in after.weights  # the artifact stores one copy


def test_olmo2_gate_up_without_a_norm():
    """OLMo 2 normalises after the MLP: its gate_up has no prologue, and takes the epilogue alone."""
    before, config = prepared("olmo2")
    LinearPrologue()(before)
    after = copy_graph(before)
    counts = LinearEpilogue()(after)
    DeadCodeElimination()(after)
    assert counts == {"add_rms_norm": 0, "none": config.num_hidden_layers}
    assert targets(after).count(ops.linear_act_and_mul.default) == config.num_hidden_layers
    assert_interleaved(before, after, [n for n in after.graph.nodes if n.target == ops.linear_act_and_mul.default])
    assert_same_function(before, after, config, seeds=(1, 2), atol=0.0)


def test_without_the_prologue_pass():
    """--no-linear-prologue: silu_and_mul after a plain gate_up still folds; the norms stay their own ops."""
    before, config = prepared("llama")
    after = copy_graph(before)
    counts = LinearEpilogue()(after)
    DeadCodeElimination()(after)
    assert counts == {"add_rms_norm": 0, "none": config.num_hidden_layers}
    found = targets(after)
    assert ops.silu_and_mul.default not in found and ops.add_rms_norm.default in found
    assert_same_function(before, after, config, seeds=(1,), atol=0.0)


def test_a_shared_weight_is_read_as_its_halves():
    """A gate_up weight that is not a get_attr of this linear alone (here a graph input) is not rewritten: the op
    reads [gate; up] (interleaved=False)."""
    g = torch.fx.Graph()
    x, w = g.placeholder("x"), g.placeholder("w")
    act = g.call_function(ops.silu_and_mul.default, (g.call_function(ops.linear.default, (x, w)),))
    g.output(act)
    from graphllm.ir.graph import StepGraph
    graph = StepGraph(torch.fx.GraphModule(torch.nn.Module(), g), (), None)
    assert LinearEpilogue().apply(graph) == {"add_rms_norm": 0, "none": 1}
    (node,) = [n for n in g.nodes if n.target == ops.linear_act_and_mul.default]
    assert node.args[1] is w and node.args[-1] is False


def test_a_gate_up_read_elsewhere_stays():
    g = torch.fx.Graph()
    x, w = g.placeholder("x"), g.placeholder("w")
    gate_up = g.call_function(ops.linear.default, (x, w))
    act = g.call_function(ops.silu_and_mul.default, (gate_up,))
    g.output((act, gate_up))
    from graphllm.ir.graph import StepGraph
    graph = StepGraph(torch.fx.GraphModule(torch.nn.Module(), g), (), None)
    assert LinearEpilogue().apply(graph) == {"add_rms_norm": 0, "none": 0}


def test_ops_equal_their_parts_off_the_kernel_path():
    """CPU (and rows past the kernel's on CUDA) run the ops one after the other: exactly the unfused result."""
    gen = torch.Generator().manual_seed(0)
    x, r = torch.randn(5, 3, 32, generator=gen), torch.randn(5, 3, 32, generator=gen)
    nw, w, b = torch.randn(32, generator=gen), torch.randn(48, 32, generator=gen), torch.randn(48, generator=gen)
    linear = torch.nn.functional.linear
    assert torch.equal(linear_act_and_mul(x, w, b), reference_silu_and_mul(linear(x, w, b)))
    assert torch.equal(linear_act_and_mul(x, w, None, True), reference_gelu_tanh_and_mul(linear(x, w)))
    out, h = add_rms_norm_linear_act_and_mul(x, r, nw, 1e-5, w, b, True, False)
    assert torch.equal(h, x + r)
    assert torch.equal(out, reference_silu_and_mul(linear(reference_rms_norm(x + r, nw, 1e-5, True), w, b)))
    assert out.shape == (5, 3, 24)
    from graphllm.kernels.skinny_matmul import interleave_gate_up
    wi, bi = interleave_gate_up(w), interleave_gate_up(b)
    assert torch.equal(linear_act_and_mul(x, wi, bi, False, True), linear_act_and_mul(x, w, b))
    out_i, h_i = add_rms_norm_linear_act_and_mul(x, r, nw, 1e-5, wi, bi, True, True, True)
    out_g, _ = add_rms_norm_linear_act_and_mul(x, r, nw, 1e-5, w, b, True, True)
    assert torch.equal(out_i, out_g) and torch.equal(h_i, x + r)


def test_the_switch_is_in_the_pass_list_and_its_uuid():
    on, off = PassManager(CompileConfig(linear_epilogue=True)), PassManager(CompileConfig())
    assert "linear_epilogue" in [p.name for p in on.passes] and "linear_epilogue" not in [p.name for p in off.passes]
    names = [p.name for p in on.passes]
    assert names.index("linear_prologue") < names.index("linear_epilogue")
    assert on.uuid() != off.uuid()


@pytest.mark.parametrize("arch", ("llama", "gemma2"))  # gemma2: GeGLU
def test_int4_gate_up_takes_the_activation(arch):
    """An int4 graph (no int4 prologue: the activation is its own op after gate_up): each layer's gate_up becomes
    int4_linear_act_and_mul over qweight, scales and zeros with their columns interleaved; same function."""
    from graphllm.passes.fusion.fuse_add_rmsnorm import FuseAddRMSNorm
    from graphllm.passes.fusion.fuse_gate_up import FuseGateUp
    from graphllm.passes.fusion.fuse_qkv import FuseQKV
    from graphllm.passes.fusion.fuse_silu_mul import FuseSiluMul
    from graphllm.passes.lowering.skinny_linear import SkinnyLinear
    from graphllm.passes.quantization.quantize_int4 import QuantizeInt4
    from tests.passes.harness import tiny_step_graph
    before, config = tiny_step_graph(arch)
    for p in (QuantizeInt4(group_size=32), FuseQKV(), FuseGateUp(), FuseSiluMul(), FuseAddRMSNorm(), SkinnyLinear(),
              LinearPrologue()):
        p(before)
    after = copy_graph(before)
    layers = config.num_hidden_layers
    assert LinearEpilogue(int4_only=True)(after) == {"add_rms_norm": 0, "none": layers}
    DeadCodeElimination()(after)
    found = targets(after)
    assert found.count(ops.int4_linear_act_and_mul.default) == layers
    assert found.count(ops.int4_linear.default) == 3 * layers  # qkv, o_proj, down
    assert ops.silu_and_mul.default not in found and ops.gelu_tanh_and_mul.default not in found
    from graphllm.ir.graph import attr_tensor
    for node in [n for n in after.graph.nodes if n.target == ops.int4_linear_act_and_mul.default]:
        assert node.args[-2] is (arch == "gemma2") and node.args[-1] is True
        for new in node.args[1:4]:
            t, t0 = attr_tensor(after.gm, new), before.weights[new.target.removesuffix("_interleaved")]
            n = t0.shape[1] // 2
            assert torch.equal(t[:, 0::2], t0[:, :n]) and torch.equal(t[:, 1::2], t0[:, n:])
            assert new.target.removesuffix("_interleaved") not in after.weights
    assert_same_function(before, after, config, seeds=(1, 2), atol=0.0)
    from graphllm.compiler.pipeline import kernel_plan  # the manifest still names gate_up's shape
    assert kernel_plan(after, (1,)).keys() == kernel_plan(before, (1,)).keys() and len(kernel_plan(after, (1,))) == 4


def test_int4_op_equals_its_parts_off_the_kernel_path():
    """CPU: int4_linear_act_and_mul is int4_linear, then the activation over halves or (interleaved) column pairs."""
    from graphllm.kernels.quant_layout import quantize_int4_weight
    from graphllm.kernels.skinny_matmul import interleave_gate_up
    from graphllm.ops.quantized_linear import int4_linear, int4_linear_act_and_mul
    gen = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(2, 3, 64, generator=gen), torch.randn(48, 64, generator=gen), torch.randn(48, generator=gen)
    packed = quantize_int4_weight(w, 32)
    y = int4_linear(x, *packed, b)
    assert torch.equal(int4_linear_act_and_mul(x, *packed, b), reference_silu_and_mul(y))
    assert torch.equal(int4_linear_act_and_mul(x, *packed, None, True),
                       reference_gelu_tanh_and_mul(int4_linear(x, *packed)))
    inter = [interleave_gate_up(t.t()).t().contiguous() for t in packed]
    assert torch.equal(int4_linear_act_and_mul(x, *inter, interleave_gate_up(b), False, True),
                       reference_silu_and_mul(y))
