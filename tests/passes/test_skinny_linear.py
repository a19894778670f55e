"""SkinnyLinear: aten.linear -> graphllm.linear on GPU graphs; same logits and KV writes; CPU graphs untouched."""

import pytest
import torch

from graphllm.ops.linear import linear as linear_op, takes_kernel
from graphllm.passes.fusion.fuse_qkv import FuseQKV
from graphllm.passes.lowering.skinny_linear import SkinnyLinear
from graphllm.passes.manager import PassManager
from tests.passes.harness import assert_same_function, copy_graph, tiny_step_graph

LINEAR = torch.ops.graphllm.linear.default


@pytest.mark.parametrize("arch", ("llama", "qwen2"))  # qwen2: linears with a bias
def test_same_function_when_forced_on_cpu(arch):
    before, config = tiny_step_graph(arch)
    FuseQKV()(before)
    after = copy_graph(before)
    linears = sum(n.target == torch.ops.aten.linear.default for n in before.graph.nodes)
    counts = SkinnyLinear()(after)
    assert counts == {"replaced": linears} and linears == 5 * config.num_hidden_layers + 1  # qkv, o, gate, up, down; lm_head
    assert not any(n.target == torch.ops.aten.linear.default for n in after.graph.nodes)
    assert sum(n.target == LINEAR for n in after.graph.nodes) == linears
    assert_same_function(before, after, config, seeds=(1, 2))


def test_cpu_graph_is_left_alone():
    graph, _ = tiny_step_graph("llama")
    code = graph.gm.code
    report = PassManager.run_one(SkinnyLinear(), graph)  # the manager reads the pass's devices
    assert report.counts == {} and report.skipped == "for cuda graphs, this one is cpu"
    assert graph.gm.code == code


def test_op_equals_f_linear_and_traces_to_one_node():
    x, w, b = torch.randn(5, 3, 8), torch.randn(4, 8), torch.randn(4)
    torch.testing.assert_close(linear_op(x, w, b), torch.nn.functional.linear(x, w, b), rtol=0, atol=0)
    traced = torch.fx.experimental.proxy_tensor.make_fx(lambda a, c: LINEAR(a, c), tracing_mode="fake")(x, w)
    assert [n.target for n in traced.graph.nodes if n.op == "call_function"] == [LINEAR]


def test_kernel_only_for_small_half_batches_on_cuda():
    w = torch.randn(32, 64, dtype=torch.bfloat16)
    assert not takes_kernel(torch.randn(1, 64, dtype=torch.bfloat16), w, None)  # CPU
    if torch.cuda.is_available():
        w = w.cuda()
        assert takes_kernel(torch.randn(1, 64, dtype=torch.bfloat16, device="cuda"), w, None)
        assert not takes_kernel(torch.randn(2, 64, dtype=torch.bfloat16, device="cuda"), w, None)  # cuBLAS wins
        assert not takes_kernel(torch.randn(1, 64, device="cuda"), w.float(), None)  # float32: cuBLAS
        vocab = torch.randn(1 << 16, 64, dtype=torch.bfloat16, device="cuda")
        assert takes_kernel(torch.randn(16, 64, dtype=torch.bfloat16, device="cuda"), vocab, None)
        assert not takes_kernel(torch.randn(17, 64, dtype=torch.bfloat16, device="cuda"), vocab, None)
