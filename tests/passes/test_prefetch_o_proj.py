"""prefetch_o_proj: every attention op gets its layer's o_proj weight as the prefetch hint (bf16, fp8 and int4
linears, rope_attention too), the graph computes exactly what it computed before, CPU graphs are left alone, and
the hint reaches the triton backend's decode kernel only on sm_90+ at small batches."""

import pytest
import torch

from graphllm.config import CompileConfig
from graphllm.passes.fusion.fuse_qkv import FuseQKV
from graphllm.passes.fusion.fuse_rope_attention import FuseRopeAttention
from graphllm.passes.lowering.prefetch_o_proj import ATTENTION, PrefetchOProj
from graphllm.passes.lowering.skinny_linear import SkinnyLinear
from graphllm.passes.manager import PassManager, build_pass_list
from graphllm.passes.quantization.quantize_fp8 import QuantizeFP8
from graphllm.passes.quantization.quantize_fp8_activations import QuantizeFP8Activations
from graphllm.passes.quantization.quantize_int4 import QuantizeInt4
from tests.passes.harness import assert_same_function, copy_graph, tiny_step_graph


def hints(graph) -> list[str]:
    """The weight name each attention op is hinted with, in graph order (None: no hint)."""
    return [getattr(n.kwargs.get("prefetch"), "target", None) for n in graph.graph.nodes
            if n.op == "call_function" and n.target in ATTENTION]


@pytest.mark.parametrize("scheme", [None, "fp8", "int4"])
def test_each_attention_gets_its_o_proj_weight_and_computes_the_same(scheme):
    before, config = tiny_step_graph("llama")
    if scheme == "fp8":
        QuantizeFP8()(before)
    elif scheme == "int4":
        QuantizeInt4(group_size=32)(before)
    FuseQKV()(before)
    SkinnyLinear()(before)
    FuseRopeAttention()(before)
    if scheme == "fp8":  # o_proj's input then goes through fp8_quantize and its getitem
        QuantizeFP8Activations()(before)
    after = copy_graph(before)
    layers = config.num_hidden_layers
    assert PrefetchOProj()(after) == {"hinted": layers}
    names = hints(after)
    assert len(names) == layers and all(f"layers.{i}." in name and "o_proj" in name for i, name in enumerate(names))
    after.graph.lint()  # each hinted weight is defined before the op that reads it
    assert PrefetchOProj()(after) == {"hinted": 0}  # once only
    assert_same_function(before, after, config, seeds=(1, 2), atol=0.0)


def test_plain_attention_ops_are_hinted_too():
    graph, config = tiny_step_graph("llama")
    assert PrefetchOProj()(graph) == {"hinted": config.num_hidden_layers}  # graphllm.attention over aten.linear
    assert all("o_proj" in name for name in hints(graph))


def test_cpu_graph_is_left_alone_and_the_switch_adds_the_pass_last():
    graph, _ = tiny_step_graph("llama")
    report = PassManager.run_one(PrefetchOProj(), graph)
    assert report.counts == {} and report.skipped == "for cuda graphs, this one is cpu"
    names = [p.name for p in build_pass_list(CompileConfig(prefetch_o_proj=True, quantization="fp8"))]
    assert names[-3:] == ["prefetch_o_proj", "eliminate_noops", "dce"] and names[-4] == "quantize_fp8_activations"
    assert "prefetch_o_proj" not in [p.name for p in build_pass_list(CompileConfig())]
    assert PassManager(CompileConfig(prefetch_o_proj=True)).uuid() != PassManager(CompileConfig()).uuid()


def test_triton_backend_passes_the_hint_to_small_decode_launches_on_sm90_only(monkeypatch):
    pytest.importorskip("triton")
    from graphllm.backends.triton_backend import TritonBackend
    from graphllm.kernels.gdc import bulk_prefetch_on
    from tests.kernels.conftest import DEVICE, make_paged_kv, record_split_launches
    backend = TritonBackend()
    weight = torch.randn(64, 32, device=DEVICE)
    q = torch.randn(3, 4, 32, device=DEVICE)
    assert backend._prefetch(weight, q) is weight
    backend.prefetch_max_seqs = 2
    assert backend._prefetch(weight, q) is None
    backend.prefetch_max_seqs = 16
    kv_cache, tables = make_paged_kv([5, 9, 17], 16, 2, 32, torch.float32, 0)
    lens = torch.tensor([5, 9, 17], device=DEVICE)
    launches = record_split_launches(monkeypatch)
    backend._attend(q, kv_cache, tables, lens, torch.arange(4, device=DEVICE), 32 ** -0.5, 0, 0.0, weight)
    # sm_90+: one bulk prefetch a program; the interpreter and older GPUs: the hint dropped
    assert launches and launches[0][1].get("PREFETCH", False) == bulk_prefetch_on(q.device)
