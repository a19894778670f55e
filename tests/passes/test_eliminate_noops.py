"""EliminateNoops: same function, the no-op casts/asserts/views/copies gone, the real ones kept."""

import pytest
import torch
from torch import nn
from torch.export import Dim

from graphllm.ir import StepGraph, format_graph, op_counts
from graphllm.passes.utility.eliminate_noops import EliminateNoops
from tests.conftest import ARCHS
from tests.passes.harness import assert_same_function, copy_graph, run_pass

aten = torch.ops.aten
TO, ASSERT = "to.dtype", "_assert_tensor_metadata.default"


def rope_casts(arch: str) -> int:
    """positions int64 -> float32, once per rotary embedding (Gemma 3: a local and a global one)."""
    return 2 if arch == "gemma3" else 1


def norm_upcasts(arch: str) -> int:
    """float32 casts per RMSNorm in a bfloat16 graph: x, and Gemma's (1 + weight) too."""
    return 2 if arch.startswith("gemma") else 1


@pytest.mark.parametrize("arch", ARCHS)
def test_float32_graph_loses_every_same_dtype_cast_and_assert(arch):
    before, after, counts, ops_before, ops_after, config = run_pass(EliminateNoops(), arch)
    assert_same_function(before, after, config)
    assert ops_after[TO] == rope_casts(arch)  # positions int64 -> float32 in rope: a real cast
    assert ops_after[ASSERT] == 0
    assert counts == {"cast": ops_before[TO] - rope_casts(arch), "assert": ops_before[ASSERT], "view": 0, "clone": 0}
    assert ops_after["attention.default"] + ops_after["mla_attention.default"] == config.num_hidden_layers


@pytest.mark.parametrize("arch", ARCHS)
def test_bfloat16_graph_keeps_its_real_casts(arch):
    before, after, counts, ops_before, ops_after, config = run_pass(EliminateNoops(), arch, torch.bfloat16)
    assert_same_function(before, after, config, dtype=torch.bfloat16)
    assert counts == {"cast": 0, "assert": ops_before[ASSERT], "view": 0, "clone": 0}
    assert ops_after[TO] == ops_before[TO] and ops_after[ASSERT] == 0
    upcasts = [n for n in after.graph.nodes if n.target is aten.to.dtype and n.args[1] == torch.float32]
    # positions, plus each RMSNorm's (one mean each); MLA rotates its q and k rope parts in float32
    mla = 2 * config.num_hidden_layers if config.is_mla else 0
    assert len(upcasts) == rope_casts(arch) + norm_upcasts(arch) * ops_before["mean.dim"] + mla


def test_second_run_changes_nothing():
    _, graph, first, *_ = run_pass(EliminateNoops(), "qwen3")
    text = format_graph(graph.gm)
    assert sum(first.values()) > 0
    assert EliminateNoops()(graph) == {"cast": 0, "assert": 0, "view": 0, "clone": 0}
    assert format_graph(graph.gm) == text


# Hand-built graphs: tiny modules exported like the step (symbolic T), so meta holds FakeTensors.

def exported(module: nn.Module, *inputs) -> StepGraph:
    dynamic = tuple({0: Dim("T", min=2, max=64)} for _ in inputs)
    program = torch.export.export(module, inputs, dynamic_shapes=dynamic, strict=False)
    return StepGraph(program.module(), inputs, dynamic)


def apply_and_compare(module: nn.Module, *inputs):
    return apply_and_compare_graph(exported(module, *inputs))


def apply_and_compare_graph(graph: StepGraph):
    """(counts, op counts after); fails if the rewritten graph computes something else."""
    graph.recompile()
    before = copy_graph(graph)
    counts = EliminateNoops()(graph)
    fresh = tuple(torch.randn(7, *x.shape[1:]) for x in graph.example_inputs)
    torch.testing.assert_close(graph(*fresh), before(*fresh), rtol=0, atol=0)
    return counts, op_counts(graph.gm)


class Cast(nn.Module):
    def forward(self, x):
        return x.to(torch.float32) + x.to(torch.float64).sum()


def insert_after(graph: StepGraph, anchor, target, args, kwargs=None, val=None):
    with graph.graph.inserting_after(anchor):
        node = graph.graph.call_function(target, args, kwargs or {})
    if val is not None:
        node.meta["val"] = val
    return node


class Views(nn.Module):
    def forward(self, x):  # x: [T, 8]
        t = x.shape[0]
        same = x.view(t, -1) + x.reshape(t, 8)  # identity view and reshape
        chain = x.view(t, 2, 4).view(t, 4, 2).view(t, 8)  # folds to view(x, [t, 8]), an identity
        shared = x.view(t, 2, 4)  # two users: not folded into the next view
        kept = shared.view(t, 8) * shared.sum()
        return same + chain + kept


def test_identity_views_go_and_chains_fold():
    counts, ops = apply_and_compare(Views(), torch.randn(5, 8))
    assert counts["view"] == 5  # 2 identities, 2 folded into the chain's last view, then that identity
    assert ops["view.default"] == 2 and ops["reshape.default"] == 0  # shared and shared -> [t, 8]


def test_view_whose_shape_only_may_match_stays():
    graph = exported(Cast(), torch.randn(4, 8))
    x = next(n for n in graph.graph.nodes if n.op == "placeholder")
    # [8, T] equals x's [T, 8] when T == 8 only (export cannot trace this view without a guard)
    view = insert_after(graph, x, aten.view.default, (x, [8, -1]), val=x.meta["val"].t())
    apply_and_compare_graph(graph)
    assert view in graph.graph.nodes


class Copies(nn.Module):
    def forward(self, x):  # x: [T, 8]
        h = x * 2
        dropped = h.clone()
        written = h.clone()
        written.add_(1)  # must stay: dropped, the add_ would write h
        source = x + 1
        snapshot = source.clone()
        source.mul_(3)  # must stay: it saved source before the write
        transposed = h.t().contiguous().t()  # a real copy into another layout
        strided = h.t().clone().t()  # input not contiguous: kept, by the rule
        returned = (h + 1).clone()  # must stay: the output would alias h + 1
        return dropped + written + h + snapshot + source + transposed + strided, returned


def test_copies_go_unless_written_returned_or_relaid():
    graph = exported(Copies(), torch.randn(5, 8))
    h = next(n for n in graph.graph.nodes if n.target is aten.mul.Tensor)
    clone = next(n for n in graph.graph.nodes if n.target is aten.clone.default)
    # tracing drops contiguous() of a contiguous tensor; a pass could leave one behind
    contiguous = insert_after(graph, h, aten.contiguous.default, (h,), val=h.meta["val"])
    clone.replace_input_with(h, contiguous)
    counts, ops = apply_and_compare_graph(graph)
    assert counts["clone"] == 2
    assert ops["clone.default"] == 4 and ops["contiguous.default"] == 1


def test_asserts_go_only_when_meta_confirms_them():
    graph = exported(Cast(), torch.randn(4, 8))
    x = next(n for n in graph.graph.nodes if n.op == "placeholder")
    t = insert_after(graph, x, aten.sym_size.int, (x, 0), val=x.meta["val"].shape[0])
    holds = insert_after(graph, t, aten._assert_tensor_metadata.default, (x,), {"size": [t, 8], "stride": [8, 1]})
    wrong = insert_after(graph, x, aten._assert_tensor_metadata.default, (x,), {"dtype": torch.float16})
    sized = insert_after(graph, x, aten._assert_tensor_metadata.default, (x,), {"size": [4, 8]})  # T may differ
    no_meta = insert_after(graph, x, aten.neg.default, (x,))
    unknown = insert_after(graph, no_meta, aten._assert_tensor_metadata.default, (no_meta,), {"dtype": torch.float32})
    assert EliminateNoops()(graph)["assert"] == 3  # `holds` and the two export put before .to()
    assert holds not in graph.graph.nodes and {wrong, sized, unknown} <= set(graph.graph.nodes)
    assert op_counts(graph.gm)["to.dtype"] == 1  # float64: a real cast


def test_to_copy_goes_unless_its_copy_is_written():
    graph = exported(Cast(), torch.randn(4, 8))
    x = next(n for n in graph.graph.nodes if n.op == "placeholder")
    val = x.meta["val"]
    neg = insert_after(graph, x, aten.neg.default, (x,), val=val)
    free = insert_after(graph, neg, aten._to_copy.default, (neg,), {"dtype": torch.float32}, val)
    written = insert_after(graph, free, aten._to_copy.default, (neg,), {"dtype": torch.float32}, val)
    write = insert_after(graph, written, aten.add_.Tensor, (written, 1.0), val=val)
    last = insert_after(graph, write, aten.add.Tensor, (free, write), val=val)
    cast = next(n for n in graph.graph.nodes if n.target is aten.to.dtype and n.args[1] == torch.float32)
    cast.replace_input_with(x, last)  # the output now depends on both copies
    counts, ops = apply_and_compare_graph(graph)
    assert counts["cast"] == 2  # to(.., f32) and the unwritten _to_copy
    assert free not in graph.graph.nodes and written in graph.graph.nodes
    assert ops["_to_copy.default"] == 1
