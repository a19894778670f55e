"""FuseMoeRouter: each sparse layer's router linear moves into its experts' op (fused_moe_routed); the same logits and
KV writes. The op's one-token kernel is tested in tests/kernels/test_moe_router.py, its CUDA engine in
tests/gpu/test_moe_router_engine.py."""

import pytest
import torch

from graphllm.config import CompileConfig
from graphllm.ops.moe import fused_moe_routed
from graphllm.passes.lowering.fuse_moe_router import FuseMoeRouter
from graphllm.passes.lowering.linear_prologue import LinearPrologue
from graphllm.passes.lowering.shared_norm_prologue import SharedNormPrologue
from graphllm.passes.manager import PassManager
from graphllm.passes.quantization.quantize_fp8_experts import QuantizeFP8Experts
from graphllm.passes.utility.dce import DeadCodeElimination
from tests.passes.harness import assert_same_function, copy_graph
from tests.passes.test_linear_prologue import prepared, targets

ops = torch.ops.graphllm


@pytest.mark.parametrize("arch", ("qwen3_moe", "mixtral", "deepseek_v2"))
def test_every_router_moves_into_its_experts_op(arch):
    before, config = prepared(arch)
    LinearPrologue()(before)
    after = copy_graph(before)
    counts = FuseMoeRouter()(after)
    DeadCodeElimination()(after)
    sparse = targets(before).count(ops.fused_moe.default)
    assert sparse >= 1 and counts == {"moe_layers": sparse}  # deepseek_v2: layer 0 is dense
    found = targets(after)
    assert ops.fused_moe.default not in found and found.count(ops.fused_moe_routed.default) == sparse
    assert found.count(ops.linear.default) == targets(before).count(ops.linear.default) - sparse
    for node in after.graph.nodes:
        if node.target == ops.fused_moe_routed.default:  # the router's weight, read where the linear read it
            assert node.args[1].op == "get_attr" and node.args[1].target.endswith("gate.weight")
    assert_same_function(before, after, config, seeds=(1, 2), atol=0.0)


def test_routers_taken_by_other_passes_are_left():
    """A router fused with its norm (shared_norm_prologue) or routing float8 experts (fused_moe_fp8) stays."""
    graph, _ = prepared("qwen3_moe")
    LinearPrologue()(graph)
    SharedNormPrologue()(graph)
    assert FuseMoeRouter()(graph) == {"moe_layers": 0}
    graph, _ = prepared("mixtral")
    QuantizeFP8Experts()(graph)
    assert FuseMoeRouter()(graph) == {"moe_layers": 0}
    dense, _ = prepared("llama")
    assert FuseMoeRouter()(dense) == {"moe_layers": 0}


def test_the_manager_runs_it_only_when_asked():
    names = lambda config: [p.name for p in PassManager(config).passes]  # noqa: E731
    assert "fuse_moe_router" not in names(CompileConfig())
    on = names(CompileConfig(fuse_moe_router=True))
    assert on.index("skinny_linear") < on.index("fuse_moe_router")
    assert "fuse_moe_router" not in names(CompileConfig(fuse_moe_router=True, skinny_linear=False))


def test_the_op_off_cuda_is_the_linear_then_fused_moe():
    gen = torch.Generator().manual_seed(0)
    x, w_router = torch.randn(3, 32, generator=gen), torch.randn(8, 32, generator=gen)
    w13, w2 = torch.randn(8, 16, 32, generator=gen) / 6, torch.randn(8, 32, 8, generator=gen) / 3
    out = fused_moe_routed(x, w_router, w13, w2, 2, True)
    assert torch.equal(out, ops.fused_moe(x, torch.nn.functional.linear(x, w_router), w13, w2, 2, True))
    torch.library.opcheck(ops.fused_moe_routed.default, (x, w_router, w13, w2, 2, False))
    with pytest.raises(RuntimeError, match="w_router"):
        fused_moe_routed(x, w_router[:4], w13, w2, 2, True)
