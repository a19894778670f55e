"""FuseSiluMul: silu(gate) * up over a fused gate/up output -> silu_and_mul; same logits and KV writes."""

import importlib
import operator
from pathlib import Path

import pytest
import torch

import graphllm.passes.fusion
from graphllm.ir import StepGraph, format_graph, module_path, op_counts
from graphllm.passes.fusion.fuse_silu_mul import FuseSiluMul
from tests.conftest import ARCHS
from tests.passes.harness import (assert_same_function, clone_inputs, copy_graph, on_reference, random_step_inputs,
                                 tiny_step_graph)

aten = torch.ops.aten
SILU_AND_MUL = torch.ops.graphllm.silu_and_mul.default
GATE_UP_FILE = Path(graphllm.passes.fusion.__file__).with_name("fuse_gate_up.py")


def fuse_gate_up_locally(graph: StepGraph) -> int:
    """Stand-in for fuse_gate_up while its file is missing: the same linear + split + getitem form."""
    fused = 0
    for mul in list(graph.graph.nodes):
        act, up = mul.args if mul.target == aten.mul.Tensor else (None, None)
        gate = act.args[0] if getattr(act, "target", None) == aten.silu.default else None
        if not all(getattr(n, "target", None) == aten.linear.default for n in (gate, up)):
            continue
        weights = [graph.gm.get_parameter(n.args[1].target) for n in (gate, up)]
        name = gate.args[1].target.replace("gate_proj.weight", "gate_up_weight")  # on the mlp module
        weight = graph.add_weight(name, torch.cat(weights), like=gate)
        with graph.graph.inserting_before(gate):
            gate_up = graph.graph.call_function(aten.linear.default, (gate.args[0], weight))
            halves = graph.graph.call_function(aten.split_with_sizes.default, (gate_up, [len(weights[0])] * 2, -1))
            items = [graph.graph.call_function(operator.getitem, (halves, i)) for i in range(2)]
        for old, item in zip((gate, up), items):
            old.replace_all_uses_with(item)
            graph.graph.erase_node(old)
        fused += 1
    graph.drop_unused_weights()
    graph.recompile()
    return fused


def fuse_gate_up(graph: StepGraph) -> None:
    """The real FuseGateUp once graphllm/passes/fusion/fuse_gate_up.py exists, else the stand-in."""
    if GATE_UP_FILE.exists():
        importlib.import_module("graphllm.passes.fusion.fuse_gate_up").FuseGateUp()(graph)
    else:
        fuse_gate_up_locally(graph)


def gate_up_graph(arch: str, dtype: torch.dtype = torch.float32):
    """(unfused graph, gate/up-fused graph, config)."""
    plain, config = tiny_step_graph(arch, dtype)
    split = copy_graph(plain)
    fuse_gate_up(split)
    return plain, split, config


SWIGLU = [arch for arch in ARCHS if not arch.startswith("gemma")]  # Gemma: test_gemma_geglu_becomes_gelu_tanh_and_mul


@pytest.fixture(scope="module", params=SWIGLU)
def fused(request):
    """(plain, before = gate/up fused, after = + FuseSiluMul, counts, config), one run per arch."""
    plain, before, config = gate_up_graph(request.param)
    after = copy_graph(before)
    return plain, before, after, FuseSiluMul()(after), config


def test_same_function(fused):
    plain, before, after, _, config = fused
    assert_same_function(before, after, config, seeds=(1, 2))
    assert_same_function(plain, after, config, seeds=(3,))


def test_bit_identical_to_the_split_graph(fused):
    _, before, after, _, config = fused
    inputs = random_step_inputs(config, seed=4)
    a_in, b_in = clone_inputs(inputs), clone_inputs(inputs)
    with on_reference():
        assert torch.equal(after(*b_in), before(*a_in))


def swiglu_paths(config) -> list[str]:
    """The module path of every SwiGLU the step runs, in order: a dense layer's MLP, and an MoE layer's shared
    experts (DeepSeek-V2); routed experts are one fused_moe."""
    shared = getattr(config, "n_shared_experts", 0)
    return [f"model.model.layers.{i}.mlp" + (".shared_experts" if i in config.sparse_layers else "")
            for i in range(config.num_hidden_layers) if i not in config.sparse_layers or shared]


def test_counts_and_ops(fused):
    _, before, after, counts, config = fused
    layers = len(swiglu_paths(config))
    ops_before, ops_after = op_counts(before.gm), op_counts(after.gm)
    assert counts == {"fused": layers}
    assert ops_before["silu.default"] == layers and ops_after["silu.default"] == 0
    assert ops_after["silu_and_mul.default"] == layers
    assert ops_before["split_with_sizes.default"] - ops_after["split_with_sizes.default"] == layers
    assert ops_before["getitem"] - ops_after["getitem"] == 2 * layers
    assert ops_before["mul.Tensor"] - ops_after["mul.Tensor"] == layers
    assert ops_after["linear.default"] == ops_before["linear.default"]


def test_op_reads_the_gate_up_linear_and_keeps_the_source(fused):
    _, _, after, _, config = fused
    nodes = [n for n in after.graph.nodes if n.target == SILU_AND_MUL]
    assert [module_path(node) for node in nodes] == swiglu_paths(config)
    for node in nodes:
        (gate_up,) = node.args
        assert gate_up.target == aten.linear.default and list(gate_up.users) == [node]
        phi3 = "models/phi3.py" in node.meta["stack_trace"]  # its MLP keeps the checkpoint's gate_up_proj
        assert ("up * F.silu(gate)" if phi3 else "F.silu(self.gate_proj(x)) * self.up_proj(x)") in node.meta[
            "stack_trace"]


def test_second_run_changes_nothing(fused):
    _, _, after, _, _ = fused
    again = copy_graph(after)
    assert FuseSiluMul()(again) == {"fused": 0}
    assert format_graph(again.gm) == format_graph(after.gm)


@pytest.mark.parametrize("arch", ("llama", "qwen3"))
def test_separate_gate_and_up_linears_are_left_alone(arch):
    graph, _ = tiny_step_graph(arch)
    text = format_graph(graph.gm)
    assert op_counts(graph.gm)["silu.default"] > 0
    assert FuseSiluMul()(graph) == {"fused": 0}
    assert format_graph(graph.gm) == text


def test_swapped_halves_are_left_alone():
    """silu(second half) * first half is not silu_and_mul: it must not be fused."""
    _, graph, config = gate_up_graph("llama")
    for split in [n for n in graph.graph.nodes if n.target == aten.split_with_sizes.default]:
        for item in list(split.users):
            item.args = (split, 1 - item.args[1])
    graph.recompile()
    before = copy_graph(graph)
    assert FuseSiluMul()(graph) == {"fused": 0}
    assert op_counts(graph.gm)["silu.default"] == config.num_hidden_layers
    assert_same_function(before, graph, config, seeds=(1,))


def test_stand_in_gives_the_form_fuse_gate_up_promises():
    """The local stand-in keeps this file honest whether or not fuse_gate_up.py exists."""
    plain, config = tiny_step_graph("llama")
    graph = copy_graph(plain)
    assert fuse_gate_up_locally(graph) == config.num_hidden_layers
    assert FuseSiluMul()(graph) == {"fused": config.num_hidden_layers}
    assert_same_function(plain, graph, config, seeds=(1,))


def test_bfloat16():
    plain, before, config = gate_up_graph("llama", torch.bfloat16)
    after = copy_graph(before)
    assert FuseSiluMul()(after) == {"fused": config.num_hidden_layers}
    assert op_counts(after.gm)["silu.default"] == 0
    assert_same_function(before, after, config, seeds=(1,), dtype=torch.bfloat16, atol=2e-2)


@pytest.mark.parametrize("arch", ["gemma2", "gemma3"])
def test_gemma_geglu_becomes_gelu_tanh_and_mul(arch):
    """Gemma's MLP is gelu(gate, approximate="tanh") * up: one graphllm.gelu_tanh_and_mul per layer over the
    fused gate/up output, bit for bit in float32."""
    plain, before, config = gate_up_graph(arch)
    after = copy_graph(before)
    assert FuseSiluMul()(after) == {"fused": config.num_hidden_layers}
    ops = op_counts(after.gm)
    assert ops["gelu_tanh_and_mul.default"] == config.num_hidden_layers and "gelu.default" not in ops
    assert "silu_and_mul.default" not in ops and "split_with_sizes.default" not in ops
    inputs = random_step_inputs(config, seed=4)
    a_in, b_in = clone_inputs(inputs), clone_inputs(inputs)
    with on_reference():
        assert torch.equal(after(*b_in), before(*a_in))
    assert_same_function(plain, after, config, seeds=(1,))


def test_gelu_without_tanh_is_left_alone():
    """Exact GELU is another function: the pass takes only the tanh approximation."""
    plain, before, config = gate_up_graph("gemma2")
    for node in before.graph.nodes:
        if node.target == torch.ops.aten.gelu.default:
            node.kwargs = {"approximate": "none"}
    before.gm.recompile()
    after = copy_graph(before)
    assert FuseSiluMul()(after) == {"fused": 0}
