"""FuseRopeAttention: q/k rotary + attention -> graphllm.rope_attention on GPU graphs; same logits and
KV writes (torch reference backend); CPU graphs untouched. The triton kernel behind the op is
checked in tests/kernels/test_rope_store_kv.py."""

import pytest
import torch

from graphllm.passes.fusion.fuse_rope_attention import FuseRopeAttention, match_rotary
from graphllm.passes.manager import PassManager, build_pass_list
from graphllm.config import CompileConfig
from tests.passes.harness import assert_same_function, copy_graph, tiny_step_graph

ops, aten = torch.ops.graphllm, torch.ops.aten


def targets(graph) -> list:
    return [n.target for n in graph.graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize("arch", ("llama", "mistral", "qwen2", "qwen3"))  # qwen3: q/k norms before the rotary
def test_same_function_when_forced_on_cpu(arch):
    before, config = tiny_step_graph(arch)
    after = copy_graph(before)
    counts = FuseRopeAttention()(after)
    assert counts == {"fused": config.num_hidden_layers}
    found = targets(after)
    assert ops.attention.default not in found and found.count(ops.rope_attention.default) == config.num_hidden_layers
    # every rotation's nodes are gone; one cat stays: cos/sin's table, cat(freqs, freqs)
    assert aten.neg.default not in found and aten.chunk.default not in found and found.count(aten.cat.default) == 1
    assert_same_function(before, after, config, seeds=(1, 2))


@pytest.mark.parametrize("arch", ("gemma2", "gemma3"))
def test_gemma_layers_keep_their_window_scale_soft_cap_and_rope(arch):
    """Gemma's attention nodes carry a per-layer scale, window and soft cap (a 12th argument, which export
    leaves out when it is the default 0): they move over as they are; Gemma 3's sliding and global layers
    rotate with cos/sin of their own rope."""
    before, config = tiny_step_graph(arch)
    after = copy_graph(before)
    assert FuseRopeAttention()(after) == {"fused": config.num_hidden_layers}

    def scalars(node, first: int) -> tuple:  # (scale, sliding_window, logit_softcap)
        return (*node.args[first:first + 2], node.args[first + 2] if len(node.args) > first + 2 else 0.0)

    old = [scalars(n, 9) for n in before.graph.nodes if n.target == ops.attention.default]
    fused = [n for n in after.graph.nodes if n.target == ops.rope_attention.default]
    assert [scalars(n, 11) for n in fused] == old
    assert old == [(config.attention_scale, config.window_of(i), config.attn_logit_softcapping)
                   for i in range(config.num_hidden_layers)]
    assert len({n.args[3] for n in fused}) == (2 if arch == "gemma3" else 1)  # the cos nodes
    assert_same_function(before, after, config, seeds=(1,))


def test_cpu_graph_is_left_alone():
    graph, _ = tiny_step_graph("llama")
    code = graph.gm.code
    report = PassManager.run_one(FuseRopeAttention(), graph)  # the manager reads the pass's devices
    assert report.counts == {} and report.skipped == "for cuda graphs, this one is cpu"
    assert graph.gm.code == code


def test_in_the_pass_list_before_the_linear_lowering_when_asked():
    names = [p.name for p in build_pass_list(CompileConfig(fuse_rope_attention=True))]
    assert names.index("fuse_rope_attention") < names.index("skinny_linear")
    assert "fuse_rope_attention" not in [p.name for p in build_pass_list(CompileConfig(fuse_rope_attention=False))]


def test_rotations_with_different_cos_are_left_alone():
    """q rotated by one table and k by another: there is no single (cos, sin) to hand the op."""
    graph, config = tiny_step_graph("llama")
    attn = next(n for n in graph.graph.nodes if n.target == ops.attention.default)
    k_rot = match_rotary(attn.args[1])
    times_cos = k_rot.nodes[1]  # xk * unsqueeze(cos, 1)
    with graph.graph.inserting_before(times_cos):
        other_cos = graph.graph.call_function(aten.mul.Tensor, (k_rot.cos, 1.0))
        other_cos.meta["val"] = k_rot.cos.meta["val"]
        times_cos.replace_input_with(k_rot.nodes[3], graph.graph.call_function(aten.unsqueeze.default, (other_cos, 1)))
    graph.recompile()
    assert FuseRopeAttention()(graph) == {"fused": config.num_hidden_layers - 1}


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CPU artifact; this file's CPU compile crashed (SIGSEGV) on the "
                    "H200 host, where tests/gpu check the op in compiled CUDA graphs")
@pytest.mark.parametrize("lowering", ("aoti", "inductor"))
def test_compiled_with_the_op_gives_the_eager_tokens(lowering, tiny_model_dir, tmp_path, monkeypatch):
    """The op survives both lowerings (strided q/k/v views in, a fresh tensor out): forced on for a CPU artifact."""
    from graphllm import Engine, SamplingParams
    from graphllm.compiler.pipeline import compile_model
    monkeypatch.setattr(FuseRopeAttention, "devices", ("cpu", "cuda"))  # what the pass manager reads
    folder, _ = tiny_model_dir("llama")
    manifest = compile_model(folder, tmp_path / "art", CompileConfig(
        dtype="float32", lowering=lowering, max_num_seqs=4, max_num_batched_tokens=64, fuse_rope_attention=True),
        device="cpu",
        show_progress=False)
    assert {"name": "fuse_rope_attention", "counts": {"fused": 2}}.items() <= next(
        r for r in manifest["passes"] if r["name"] == "fuse_rope_attention").items()
    prompts, greedy = [[1, 5, 9, 17, 33], [1, 42], list(range(3, 24))], SamplingParams(temperature=0, max_tokens=8,
                                                                                       ignore_eos=True)
    got = Engine.load(str(tmp_path / "art"), device="cpu").generate(prompts, greedy)
    expected = Engine.from_pretrained(str(folder), dtype="float32", device="cpu").generate(prompts, greedy)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in expected]


@pytest.mark.parametrize("arch", ("qwen3", "gemma3"))  # per-head q/k norms; Gemma 3's scale by 1 + weight
def test_head_norms_fold_into_the_op_after_fuse_add_rmsnorm(arch):
    """Once fuse_add_rmsnorm has turned the q/k norms into graphllm.rms_norm nodes, they move into the op (its
    q_norm / k_norm arguments) and the graph computes the same function; fold_head_norms=False leaves them."""
    from graphllm.passes.fusion.fuse_add_rmsnorm import FuseAddRMSNorm
    before, config = tiny_step_graph(arch)
    FuseAddRMSNorm()(before)
    after, kept = copy_graph(before), copy_graph(before)
    layers = config.num_hidden_layers
    assert FuseRopeAttention()(after) == {"fused": layers, "head_norms": layers}
    assert FuseRopeAttention(fold_head_norms=False)(kept) == {"fused": layers}
    norms = lambda g: targets(g).count(ops.rms_norm.default)  # noqa: E731
    assert norms(after) == norms(kept) - 2 * layers
    fused = [n for n in after.graph.nodes if n.target == ops.rope_attention.default]
    assert all(len(n.args) == 18 and n.args[14].op == n.args[15].op == "get_attr" for n in fused)  # q_norm, k_norm
    assert {n.args[17] for n in fused} == {arch == "gemma3"}  # unit_offset
    assert_same_function(before, after, config, seeds=(1, 2))
    assert FuseRopeAttention().uuid() != FuseRopeAttention(fold_head_norms=False).uuid()
