"""FuseAddRMSNorm: each RMSNorm -> rms_norm / add_rms_norm; same logits and KV writes (bit for bit in f32)."""

import pytest
import torch

from graphllm.ir import StepGraph, op_counts
from graphllm.passes.fusion.fuse_add_rmsnorm import FuseAddRMSNorm, rmsnorm_groups
from tests.conftest import ARCHS
from tests.passes.harness import (assert_same_function, clone_inputs, copy_graph, on_reference, random_step_inputs, run_pass,
                                 tiny_step_graph)

FUSED = (torch.ops.graphllm.rms_norm.default, torch.ops.graphllm.add_rms_norm.default)


# OLMo 2: test_olmo2_norms_are_left_alone; Gemma: test_gemma_norms_fuse_with_unit_offset
PRE_NORM = [arch for arch in ARCHS if arch != "olmo2" and not arch.startswith("gemma")]


@pytest.fixture(scope="module", params=PRE_NORM)
def fused(request):
    """(arch, before, after, counts, op counts before, op counts after, config), one pass run per arch."""
    return (request.param, *run_pass(FuseAddRMSNorm(), request.param))


def mla_norms(arch: str) -> int:
    """Norms per layer inside DeepSeek-V2's attention, not after a residual add: kv_a_layernorm, and
    q_a_layernorm when q goes through a low-rank projection (the -qlora config)."""
    return (2 if arch.endswith("qlora") else 1) if arch.startswith("deepseek") else 0


def expected_counts(arch: str, layers: int) -> dict[str, int]:
    """Embedding -> rms_norm; every later layer norm and the final norm read a residual add."""
    inner = 2 * layers if arch.startswith("qwen3") else mla_norms(arch) * layers
    return {"rms_norm": 1 + inner, "add_rms_norm": 2 * layers}


def fused_nodes(graph: StepGraph) -> list:
    return [n for n in graph.graph.nodes if n.target in FUSED]


def test_same_function(fused):
    _, before, after, _, _, _, config = fused
    assert_same_function(before, after, config, seeds=(1, 2))


def test_bit_identical_in_float32(fused):
    _, before, after, _, _, _, config = fused
    inputs = random_step_inputs(config, seed=3)
    a_in, b_in = clone_inputs(inputs), clone_inputs(inputs)
    with on_reference():
        assert torch.equal(after(*b_in), before(*a_in))
    assert all(torch.equal(a, b) for a, b in zip(a_in[-1], b_in[-1]))


def test_counts_and_ops(fused):
    arch, _, _, counts, ops_before, ops_after, config = fused
    layers = config.num_hidden_layers
    norms = 2 * layers + 1 + (2 * layers if arch.startswith("qwen3") else mla_norms(arch) * layers)
    assert counts == expected_counts(arch, layers)
    assert ops_before["rsqrt.default"] == norms and ops_after["rsqrt.default"] == 0
    assert ops_before["pow.Tensor_Scalar"] == norms and ops_after["pow.Tensor_Scalar"] == 0
    assert ops_after["rms_norm.default"] == counts["rms_norm"]
    assert ops_after["add_rms_norm.default"] == counts["add_rms_norm"]
    assert ops_after["rms_norm.default"] + ops_after["add_rms_norm.default"] == norms
    # one eps add per norm, and one folded residual add per add_rms_norm
    assert ops_before["add.Tensor"] - ops_after["add.Tensor"] == norms + 2 * layers


def test_no_node_of_a_norm_is_left_behind(fused):
    _, _, after, _, _, _, _ = fused
    for group in rmsnorm_groups(after.graph):
        rest = [n.format_node() for n in group if n.target not in FUSED and n.args[0].target not in FUSED]
        assert rest == [] and len([n for n in group if n.target in FUSED]) == 1


def test_fused_nodes_keep_weight_eps_and_source(fused):
    _, _, after, _, _, _, config = fused
    nodes = fused_nodes(after)
    for node in nodes:
        weight, eps = node.args[-2:]
        stack = node.meta["nn_module_stack"]
        assert weight.op == "get_attr" and weight.target == f"{list(stack.values())[-1][0]}.weight"
        assert eps == config.rms_norm_eps
        assert "self.weight * x.to(dtype)" in node.meta["stack_trace"]  # RMSNorm's output line
    last = nodes[-1]
    assert last.target is FUSED[1] and last.args[-2].target == "model.model.norm.weight"


def test_residual_stream_reads_the_second_output(fused):
    """Each layer's next residual add reads new_residual, not a recomputed sum."""
    _, _, after, _, _, _, config = fused
    residuals = [u for n in fused_nodes(after) if n.target is FUSED[1] for u in n.users if u.args[1] == 1]
    assert len(residuals) == 2 * config.num_hidden_layers - 1  # the final norm's sum is read by no one
    for item in residuals:
        assert {u.target for u in item.users} <= {torch.ops.aten.add.Tensor, *FUSED}


def test_second_run_changes_nothing(fused):
    _, _, after, _, _, _, _ = fused
    again = copy_graph(after)
    assert FuseAddRMSNorm()(again) == {"rms_norm": 0, "add_rms_norm": 0}
    assert op_counts(again.gm) == op_counts(after.gm)


def change_exponent(graph: StepGraph, group: list) -> None:
    """The first norm squares nothing any more: x ** 4 instead of x ** 2."""
    sq = next(n for n in group if n.target == torch.ops.aten.pow.Tensor_Scalar)
    sq.args = (sq.args[0], 4)


def leak_inner_value(graph: StepGraph, group: list) -> None:
    """A node of the first norm, not part of RMSNorm's math, feeds q_proj: the group must stay."""
    n = next(n for n in group if n.target == torch.ops.aten.mul.Tensor and n.args[1].target
             == torch.ops.aten.rsqrt.default)
    y = [n for n in group if n.target != torch.ops.aten._assert_tensor_metadata.default][-1]
    q_proj = next(u for u in y.users if u.target == torch.ops.aten.linear.default)
    with graph.graph.inserting_after(n):
        extra = graph.graph.call_function(torch.ops.aten.mul.Tensor, (n, 0.5))
    extra.meta.update({k: n.meta[k] for k in ("nn_module_stack", "stack_trace")})
    with graph.graph.inserting_before(q_proj):
        mixed = graph.graph.call_function(torch.ops.aten.add.Tensor, (y, extra))
    q_proj.replace_input_with(y, mixed)


def read_float_cast(graph: StepGraph, group: list) -> None:
    """In bfloat16 the norm's x.float() is a real cast; someone else reading it keeps the group."""
    cast = next(n for n in group if n.target == torch.ops.aten.to.dtype)
    y = [n for n in group if n.target != torch.ops.aten._assert_tensor_metadata.default][-1]
    q_proj = next(u for u in y.users if u.target == torch.ops.aten.linear.default)
    with graph.graph.inserting_before(q_proj):
        back = graph.graph.call_function(torch.ops.aten.to.dtype, (cast, torch.bfloat16))
        mixed = graph.graph.call_function(torch.ops.aten.add.Tensor, (y, back))
    q_proj.replace_input_with(y, mixed)


@pytest.mark.parametrize("change, dtype", ((change_exponent, torch.float32), (leak_inner_value, torch.float32),
                                           (read_float_cast, torch.bfloat16)))
def test_a_norm_that_is_not_plain_rmsnorm_is_left_alone(change, dtype):
    graph, config = tiny_step_graph("llama", dtype)
    change(graph, rmsnorm_groups(graph.graph)[0])
    graph.recompile()
    before = copy_graph(graph)
    counts = FuseAddRMSNorm()(graph)
    assert counts == {"rms_norm": 0, "add_rms_norm": 4}  # the first norm (of the embedding) kept
    assert op_counts(graph.gm)["rsqrt.default"] == 1
    atol = 1e-5 if dtype == torch.float32 else 2e-2
    assert_same_function(before, graph, config, seeds=(1,), dtype=dtype, atol=atol)


def drop_noop_casts(graph: StepGraph) -> None:
    """What a no-op elimination leaves of a float32 graph: no f32 -> f32 casts, no asserts."""
    for node in list(graph.graph.nodes):
        if node.target == torch.ops.aten.to.dtype and node.args[0].meta["val"].dtype == node.args[1]:
            node.replace_all_uses_with(node.args[0])
        if node.target in (torch.ops.aten.to.dtype, torch.ops.aten._assert_tensor_metadata.default):
            if not node.users:
                graph.graph.erase_node(node)
    graph.recompile()


@pytest.mark.parametrize("arch", ("llama", "qwen3"))
def test_graph_without_noop_casts(arch):
    graph, config = tiny_step_graph(arch)
    drop_noop_casts(graph)
    assert op_counts(graph.gm)["to.dtype"] == 1  # rope's int64 -> float32 positions
    before = copy_graph(graph)
    assert FuseAddRMSNorm()(graph) == expected_counts(arch, config.num_hidden_layers)
    assert op_counts(graph.gm)["rsqrt.default"] == 0
    inputs = random_step_inputs(config, seed=5)
    a_in, b_in = clone_inputs(inputs), clone_inputs(inputs)
    with on_reference():
        assert torch.equal(graph(*b_in), before(*a_in))


def test_bfloat16():
    before, after, counts, _, ops_after, config = run_pass(FuseAddRMSNorm(), "llama", torch.bfloat16)
    assert counts == expected_counts("llama", config.num_hidden_layers)
    assert ops_after["rsqrt.default"] == 0 and ops_after["to.dtype"] < op_counts(before.gm)["to.dtype"]
    assert_same_function(before, after, config, seeds=(1,), dtype=torch.bfloat16, atol=2e-2)


def test_olmo2_norms_are_left_alone():
    """OLMo 2's RMSNorm scales in float32 and then casts (Llama's casts, then scales): not the order the fused
    ops compute, and its graph ends in that cast, a form the matcher does not take; so the pass leaves all
    its norms, and the function is the same."""
    before, after, counts, ops_before, ops_after, config = run_pass(FuseAddRMSNorm(), "olmo2")
    assert counts == {"rms_norm": 0, "add_rms_norm": 0}
    norms = 4 * config.num_hidden_layers + 1  # q_norm, k_norm and the two post-norms per layer, the final norm
    assert ops_before["rsqrt.default"] == ops_after["rsqrt.default"] == norms
    assert_same_function(before, after, config, seeds=(1,))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("arch", ["gemma2", "gemma3"])
def test_gemma_norms_fuse_with_unit_offset(arch, dtype):
    """Gemma's RMSNorm scales by (1 + weight) in float32, then casts (models/gemma.py): each becomes the fused
    op with unit_offset=True, the post-norms (on attention's and the MLP's outputs) and the embedding's norm
    and Gemma 3's per-head q/k norms alone, the pre-norms after a residual add with it. Bit for bit in
    float32."""
    before, after, counts, ops_before, ops_after, config = run_pass(FuseAddRMSNorm(), arch, dtype)
    layers = config.num_hidden_layers
    qk = 2 * layers if arch == "gemma3" else 0
    # alone: the first input norm, two post-norms a layer, q/k norms; after an add: the pre-feedforward norm,
    # the next layer's input norm, the final norm
    assert counts == {"rms_norm": 1 + 2 * layers + qk, "add_rms_norm": 2 * layers}
    assert ops_before["rsqrt.default"] == 4 * layers + 1 + qk and "rsqrt.default" not in ops_after
    assert all(n.args[-1] is True for n in fused_nodes(after))
    if dtype == torch.float32:
        inputs = random_step_inputs(config, seed=3)
        a_in, b_in = clone_inputs(inputs), clone_inputs(inputs)
        with on_reference():
            assert torch.equal(after(*b_in), before(*a_in))
    else:
        assert_same_function(before, after, config, seeds=(1,), dtype=dtype, atol=2e-2)
