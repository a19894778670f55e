"""SharedNormPrologue: a MoE layer's post-attention norm, read by the router's linear and by the experts, folds into
the router's linear, which hands its output to the experts; the same logits and KV writes. The fused op's CPU path
is the norm, then the linear, and its kernel path is tested in tests/kernels/test_skinny_matmul.py."""

import pytest
import torch

from graphllm.config import CompileConfig
from graphllm.kernels.reference import reference_rms_norm
from graphllm.ops.linear import add_rms_norm_linear_normed
from graphllm.passes.lowering.linear_prologue import LinearPrologue
from graphllm.passes.lowering.shared_norm_prologue import SharedNormPrologue
from graphllm.passes.manager import PassManager
from graphllm.passes.utility.dce import DeadCodeElimination
from tests.passes.harness import assert_same_function, copy_graph
from tests.passes.test_linear_prologue import prepared, targets

ops = torch.ops.graphllm


@pytest.mark.parametrize("arch", ("qwen3_moe", "mixtral"))
def test_the_router_takes_the_post_attention_norm(arch):
    before, config = prepared(arch)
    LinearPrologue()(before)
    DeadCodeElimination()(before)
    after = copy_graph(before)
    counts = SharedNormPrologue()(after)
    DeadCodeElimination()(after)
    layers = config.num_hidden_layers
    assert counts == {"add_rms_norm": layers}
    found = targets(after)
    assert found.count(ops.add_rms_norm_linear_normed.default) == layers
    assert found.count(ops.add_rms_norm.default) == 1  # the final norm (lm_head reads it through a row gather)
    for node in after.graph.nodes:
        if node.target == ops.fused_moe.default:  # the experts read the fused op's normed output
            x, logits = node.args[:2]
            assert x.args == (logits.args[0], 2) and logits.args[1] == 0
            assert logits.args[0].target == ops.add_rms_norm_linear_normed.default
    assert_same_function(before, after, config, seeds=(1, 2), atol=0.0)


def test_dense_layers_and_single_readers_are_left_to_linear_prologue():
    """Llama's norms each feed one linear: linear_prologue folds them all, and nothing is left here; without
    linear_prologue a norm with one reader is not this pass's either."""
    before, _ = prepared("llama")
    after = copy_graph(before)
    assert SharedNormPrologue()(after) == {"add_rms_norm": 0}
    LinearPrologue()(after)
    assert SharedNormPrologue()(after) == {"add_rms_norm": 0}


def test_deepseek_v2_norms_with_several_linears():
    """DeepSeek-V2's norms feed two or three linears (MLA's projections; the router and the shared experts beside
    the routed ones): the first linear takes the norm and the others read its output."""
    before, config = prepared("deepseek_v2")
    LinearPrologue()(before)
    DeadCodeElimination()(before)
    after = copy_graph(before)
    counts = SharedNormPrologue()(after)
    DeadCodeElimination()(after)
    # layer 1's input norm (MLA's q and kv_a projections) and its post-attention norm (router, shared experts and
    # the routed ones); layer 0's MLP is dense (first_k_dense_replace), its norms linear_prologue's
    assert config.num_hidden_layers == 2 and counts == {"add_rms_norm": 2}
    assert targets(after).count(ops.add_rms_norm_linear_normed.default) == counts["add_rms_norm"]
    assert_same_function(before, after, config, seeds=(1, 2), atol=0.0)


def test_the_manager_runs_it_only_when_asked():
    names = lambda config: [p.name for p in PassManager(config).passes]  # noqa: E731
    assert "shared_norm_prologue" not in names(CompileConfig())
    on = names(CompileConfig(shared_norm_prologue=True))
    assert on.index("linear_prologue") < on.index("shared_norm_prologue")
    assert "shared_norm_prologue" not in names(CompileConfig(shared_norm_prologue=True, linear_prologue=False))


def test_the_op_off_the_kernel_is_the_norm_then_the_linear():
    gen = torch.Generator().manual_seed(0)
    x, r = torch.randn(3, 64, generator=gen), torch.randn(3, 64, generator=gen)
    norm_w, w, b = 1 + torch.randn(64, generator=gen) / 4, torch.randn(16, 64, generator=gen), torch.randn(16)
    out, h, y = add_rms_norm_linear_normed(x, r, norm_w, 1e-6, w, b)
    assert torch.equal(h, x + r) and torch.equal(y, reference_rms_norm(x + r, norm_w, 1e-6))
    assert torch.equal(out, torch.nn.functional.linear(y, w, b))
    torch.library.opcheck(ops.add_rms_norm_linear_normed.default, (x, r, norm_w, 1e-6, w, b, True))
