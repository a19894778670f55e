"""FuseQKV: one qkv_proj linear per attention layer; same logits and KV writes on every architecture."""

import inspect
import re

import pytest
import torch
from torch import nn

from graphllm.ir import StepGraph, format_graph, module_path, op_counts
from graphllm.passes.base import source_uuid
from graphllm.passes.fusion import linear_siblings
from graphllm.passes.fusion.fuse_qkv import FuseQKV
from tests.passes.harness import assert_same_function, copy_graph, on_reference, run_pass, split_nodes, total_elements

ARCHS = ("llama", "mistral", "qwen2", "qwen3")
ATTN = "model.model.layers.{}.self_attn"


@pytest.fixture(scope="module", params=ARCHS)
def fused(request):
    """(arch, before, after, counts, op counts before, op counts after, config), one pass run per arch."""
    return (request.param, *run_pass(FuseQKV(), request.param))


def test_same_function(fused):
    _, before, after, _, _, _, config = fused
    assert_same_function(before, after, config, seeds=(1, 2))


def test_counts_and_ops(fused):
    _, _, _, counts, ops_before, ops_after, config = fused
    layers = config.num_hidden_layers
    assert counts == {"fused": layers}
    assert ops_before["linear.default"] == 7 * layers + 1
    assert ops_after["linear.default"] == 5 * layers + 1
    assert ops_before["split_with_sizes.default"] == 0
    assert ops_after["split_with_sizes.default"] == layers
    assert ops_after["getitem"] - ops_before["getitem"] == 3 * layers


def test_split_sizes_follow_gqa_heads(fused):
    _, _, after, _, _, _, config = fused
    q, kv = config.num_attention_heads * config.head_dim, config.num_key_value_heads * config.head_dim
    assert q != kv  # the tiny configs are GQA, so a wrong order would show
    splits = split_nodes(after)
    assert [s.args[1:] for s in splits] == [([q, kv, kv], -1)] * config.num_hidden_layers
    for split in splits:
        assert sorted(u.args[1] for u in split.users) == [0, 1, 2]


def test_weights_renamed_and_concatenated(fused):
    arch, before, after, _, _, _, config = fused
    old, new = before.weights, after.weights
    kinds = ("weight", "bias") if arch == "qwen2" else ("weight",)
    for layer in range(config.num_hidden_layers):
        attn = ATTN.format(layer)
        for kind in kinds:
            parts = [old[f"{attn}.{m}.{kind}"] for m in ("q_proj", "k_proj", "v_proj")]
            assert torch.equal(new[f"{attn}.qkv_proj.{kind}"], torch.cat(parts))
            assert not {f"{attn}.{m}.{kind}" for m in ("q_proj", "k_proj", "v_proj")} & new.keys()
        assert (f"{attn}.qkv_proj.bias" in new) == (arch == "qwen2")
    assert total_elements(after) == total_elements(before)
    assert not any(re.search(r"\.[qkv]_proj\.", n.target) for n in after.graph.nodes if n.op == "get_attr")


def test_inspect_still_names_modules_and_lines(fused):
    _, _, after, _, _, _, _ = fused
    for split in split_nodes(after):
        linear = split.args[0]
        assert module_path(linear).endswith("self_attn.qkv_proj") and module_path(split) == module_path(linear)
        assert "self.q_proj(x)" in linear.meta["stack_trace"]
        k = next(u for u in split.users if u.args[1] == 1)
        assert module_path(k).endswith("self_attn.k_proj") and "self.k_proj(x)" in k.meta["stack_trace"]
        assert tuple(linear.meta["val"].shape[1:]) == (sum(split.args[1]),)


def test_second_run_is_a_no_op(fused):
    _, _, after, _, _, ops_after, _ = fused
    graph = copy_graph(after)
    text = format_graph(graph.gm)
    assert FuseQKV()(graph) == {"fused": 0}
    assert op_counts(graph.gm) == ops_after and format_graph(graph.gm) == text


def test_bfloat16():
    before, after, counts, _, _, config = run_pass(FuseQKV(), "qwen2", torch.bfloat16)
    assert counts == {"fused": config.num_hidden_layers}
    assert after.weights[f"{ATTN.format(0)}.qkv_proj.weight"].dtype == torch.bfloat16
    assert after.weights[f"{ATTN.format(0)}.qkv_proj.bias"].dtype == torch.bfloat16
    assert_same_function(before, after, config, seeds=(1,), dtype=torch.bfloat16, atol=5e-2)


def test_function_check_sees_a_k_v_swap():
    """The oracle is sharp enough: swapping the k and v rows of the fused weight is caught."""
    before, after, _, _, _, config = run_pass(FuseQKV(), "llama")
    q, kv = config.num_attention_heads * config.head_dim, config.num_key_value_heads * config.head_dim
    weight = after.gm.get_parameter(f"{ATTN.format(0)}.qkv_proj.weight")
    with on_reference():
        weight[q:] = torch.cat([weight[q + kv:], weight[q:q + kv]])
    with pytest.raises(AssertionError):
        assert_same_function(before, after, config, seeds=(1,))


def test_uuid_stable_and_versioned(monkeypatch):
    uuid = FuseQKV().uuid()
    assert re.fullmatch(r"[0-9a-f]{16}", uuid) and FuseQKV().uuid() == uuid
    monkeypatch.setattr(FuseQKV, "version", 2)
    assert FuseQKV().uuid() != uuid


def test_uuid_covers_the_shared_mechanism(monkeypatch, request):
    uuid, real = FuseQKV().uuid(), inspect.getsource
    monkeypatch.setattr(inspect, "getsource", lambda obj: real(obj) + ("#" if obj is linear_siblings else ""))
    source_uuid.cache_clear()  # uuids are cached per process
    request.addfinalizer(source_uuid.cache_clear)
    assert FuseQKV().uuid() != uuid


# Synthetic graphs for the matching rules the tiny models never hit.

class Attention(nn.Module):
    def __init__(self, biases=(True, True, True), k_reads_y=False, with_v=True, reads_k_weight=False):
        super().__init__()
        self.q_proj = nn.Linear(8, 8, bias=biases[0])
        self.k_proj = nn.Linear(8, 4, bias=biases[1])
        self.v_proj = nn.Linear(8, 4, bias=biases[2]) if with_v else None
        self.other = nn.Linear(8, 4, bias=False)
        self.k_reads_y, self.reads_k_weight = k_reads_y, reads_k_weight

    def forward(self, x, y):
        out = [self.q_proj(x), self.k_proj(y if self.k_reads_y else x), self.other(y)]
        out += [self.v_proj(x)] if self.v_proj is not None else []
        return tuple(out + ([self.k_proj.weight.sum()] if self.reads_k_weight else []))


class Wrapper(nn.Module):
    def __init__(self, attention: Attention):
        super().__init__()
        self.self_attn = attention

    def forward(self, x, y):
        return self.self_attn(x, y)


def synthetic_graph(**kwargs) -> StepGraph:
    """A captured Wrapper: linears named self_attn.{q,k,v}_proj, as in the models."""
    torch.manual_seed(0)
    inputs = (torch.randn(3, 8), torch.randn(3, 8))
    exported = torch.export.export(Wrapper(Attention(**kwargs)), inputs, strict=False)
    return StepGraph(exported.module(), inputs, None)


def test_partial_bias_gets_zeros():
    graph = synthetic_graph(biases=(True, False, True))
    before = copy_graph(graph)
    assert FuseQKV()(graph) == {"fused": 1}
    bias = graph.weights["self_attn.qkv_proj.bias"]
    assert bias.shape == (16,) and torch.equal(bias[8:12], torch.zeros(4))
    assert torch.equal(bias[:8], before.weights["self_attn.q_proj.bias"])
    x = (torch.randn(3, 8), torch.randn(3, 8))  # export specialised the size
    torch.testing.assert_close(graph(*x), before(*x))


def tie_k_to_other(attn: nn.Module) -> None:
    """Two get_attr names, one tensor (export itself routes tied uses through one name)."""
    attn.other.weight = attn.k_proj.weight


def make_v_float64(attn: nn.Module) -> None:
    attn.v_proj.weight = nn.Parameter(attn.v_proj.weight.double(), requires_grad=False)


def take_the_fused_name(attn: nn.Module) -> None:
    attn.qkv_proj = nn.Linear(8, 16)  # never clobber what is already there


@pytest.mark.parametrize("kwargs, edit", [
    (dict(reads_k_weight=True), None), ({}, tie_k_to_other), (dict(k_reads_y=True), None),
    (dict(with_v=False), None), ({}, make_v_float64), ({}, take_the_fused_name),
], ids=["weight_has_another_user", "weight_tied_to_another_name", "different_inputs", "member_missing",
        "dtypes_differ", "fused_name_taken"])
def test_not_fused(kwargs, edit):
    graph = synthetic_graph(**kwargs)
    if edit:
        edit(graph.gm.self_attn)
    ops = op_counts(graph.gm)
    assert FuseQKV()(graph) == {"fused": 0}
    assert op_counts(graph.gm) == ops and "self_attn.k_proj.weight" in graph.weights
