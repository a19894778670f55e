"""FuseGateUp: one gate_up_proj linear per MLP, in the exact form fuse_silu_mul matches."""

import inspect
import operator
import re

import pytest
import torch
from torch import nn

from graphllm.ir import StepGraph, format_graph, module_path, op_counts
from graphllm.passes.base import source_uuid
from graphllm.passes.fusion import linear_siblings
from graphllm.passes.fusion.fuse_gate_up import FuseGateUp
from graphllm.passes.fusion.fuse_qkv import FuseQKV
from tests.passes.harness import assert_same_function, copy_graph, on_reference, run_pass, split_nodes, total_elements

ARCHS = ("llama", "mistral", "qwen2", "qwen3")
MLP = "model.model.layers.{}.mlp"
aten = torch.ops.aten


@pytest.fixture(scope="module", params=ARCHS)
def fused(request):
    """(arch, before, after, counts, op counts before, op counts after, config), one pass run per arch."""
    return (request.param, *run_pass(FuseGateUp(), request.param))


def test_same_function(fused):
    _, before, after, _, _, _, config = fused
    assert_same_function(before, after, config, seeds=(1, 2))


def test_counts_and_ops(fused):
    _, _, _, counts, ops_before, ops_after, config = fused
    layers = config.num_hidden_layers
    assert counts == {"fused": layers}
    assert ops_before["linear.default"] == 7 * layers + 1
    assert ops_after["linear.default"] == 6 * layers + 1
    assert ops_before["split_with_sizes.default"] == 0
    assert ops_after["split_with_sizes.default"] == layers
    assert ops_after["getitem"] - ops_before["getitem"] == 2 * layers
    assert ops_after["silu.default"] == ops_before["silu.default"] == layers


def test_form_fuse_silu_mul_matches(fused):
    """mul(silu(getitem(split_with_sizes(t, [I, I], -1), 0)), getitem(same split, 1)), gate first."""
    _, _, after, _, _, _, config = fused
    size = config.intermediate_size
    splits = split_nodes(after)
    assert len(splits) == config.num_hidden_layers
    for split in splits:
        assert split.args[0].target is aten.linear.default and split.args[1:] == ([size, size], -1)
        gate, up = sorted(split.users, key=lambda n: n.args[1])
        assert [(g.target, g.args[1]) for g in (gate, up)] == [(operator.getitem, 0), (operator.getitem, 1)]
        (silu,) = gate.users
        (mul,) = silu.users
        assert silu.target is aten.silu.default and mul.target is aten.mul.Tensor
        assert set(mul.args) == {silu, up} and list(up.users) == [mul]


def test_weights_renamed_and_concatenated(fused):
    _, before, after, _, _, _, config = fused
    old, new = before.weights, after.weights
    for layer in range(config.num_hidden_layers):
        mlp = MLP.format(layer)
        expected = torch.cat([old[f"{mlp}.gate_proj.weight"], old[f"{mlp}.up_proj.weight"]])
        assert torch.equal(new[f"{mlp}.gate_up_proj.weight"], expected)
        assert not {f"{mlp}.gate_proj.weight", f"{mlp}.up_proj.weight", f"{mlp}.gate_up_proj.bias"} & new.keys()
    assert total_elements(after) == total_elements(before)
    assert not any(re.search(r"\.(gate|up)_proj\.", n.target) for n in after.graph.nodes if n.op == "get_attr")


def test_inspect_still_names_modules_and_lines(fused):
    _, _, after, _, _, _, _ = fused
    for split in split_nodes(after):
        linear = split.args[0]
        assert module_path(linear).endswith("mlp.gate_up_proj") and module_path(split) == module_path(linear)
        assert "self.gate_proj(x)" in linear.meta["stack_trace"]
        up = next(u for u in split.users if u.args[1] == 1)
        assert module_path(up).endswith("mlp.up_proj")
        assert tuple(linear.meta["val"].shape[1:]) == (sum(split.args[1]),)


def test_second_run_is_a_no_op(fused):
    _, _, after, _, _, ops_after, _ = fused
    graph = copy_graph(after)
    text = format_graph(graph.gm)
    assert FuseGateUp()(graph) == {"fused": 0}
    assert op_counts(graph.gm) == ops_after and format_graph(graph.gm) == text


def test_composes_with_fuse_qkv():
    before, after, _, _, _, config = run_pass(FuseQKV(), "qwen2")
    assert FuseGateUp()(after) == {"fused": config.num_hidden_layers}
    assert op_counts(after.gm)["linear.default"] == 4 * config.num_hidden_layers + 1
    assert_same_function(before, after, config, seeds=(3,))


def test_bfloat16():
    before, after, counts, _, _, config = run_pass(FuseGateUp(), "llama", torch.bfloat16)
    assert counts == {"fused": config.num_hidden_layers}
    assert after.weights[f"{MLP.format(0)}.gate_up_proj.weight"].dtype == torch.bfloat16
    assert_same_function(before, after, config, seeds=(1,), dtype=torch.bfloat16, atol=5e-2)


def test_function_check_sees_gate_and_up_swapped():
    """The oracle is sharp enough: putting up before gate in the fused weight is caught."""
    before, after, _, _, _, config = run_pass(FuseGateUp(), "llama")
    size = config.intermediate_size
    weight = after.gm.get_parameter(f"{MLP.format(0)}.gate_up_proj.weight")
    with on_reference():
        weight.copy_(torch.cat([weight[size:], weight[:size]]))
    with pytest.raises(AssertionError):
        assert_same_function(before, after, config, seeds=(1,))


def test_uuid_stable_and_versioned(monkeypatch):
    uuid = FuseGateUp().uuid()
    assert re.fullmatch(r"[0-9a-f]{16}", uuid) and FuseGateUp().uuid() == uuid
    assert uuid != FuseQKV().uuid()
    monkeypatch.setattr(FuseGateUp, "version", 2)
    assert FuseGateUp().uuid() != uuid


def test_uuid_covers_the_shared_mechanism(monkeypatch, request):
    uuid, real = FuseGateUp().uuid(), inspect.getsource
    monkeypatch.setattr(inspect, "getsource", lambda obj: real(obj) + ("#" if obj is linear_siblings else ""))
    source_uuid.cache_clear()  # uuids are cached per process
    request.addfinalizer(source_uuid.cache_clear)
    assert FuseGateUp().uuid() != uuid


class Mlp(nn.Module):
    def __init__(self, tie: bool):
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(8, 16, bias=False), nn.Linear(8, 16, bias=False)
        if tie:
            self.up_proj.weight = self.gate_proj.weight

    def forward(self, x):
        return torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x)


class Wrapper(nn.Module):
    def __init__(self, mlp: Mlp):
        super().__init__()
        self.mlp = mlp

    def forward(self, x):
        return self.mlp(x)


@pytest.mark.parametrize("tie", [False, True], ids=["separate", "tied_gate_up"])
def test_tied_weights_are_never_merged(tie):
    inputs = (torch.randn(3, 8),)
    graph = StepGraph(torch.export.export(Wrapper(Mlp(tie)), inputs, strict=False).module(), inputs, None)
    before = copy_graph(graph)
    assert FuseGateUp()(graph) == {"fused": 0 if tie else 1}
    assert ("mlp.gate_proj.weight" in graph.weights) == tie
    torch.testing.assert_close(graph(*inputs), before(*inputs))
