"""DeadCodeElimination: dead nodes and weights go; attention (it writes the KV cache) and asserts stay."""

import pytest
import torch
from torch import fx

from graphllm.ir import StepGraph
from graphllm.kernels.reference import write_kv_cache
from graphllm.passes.utility.dce import DeadCodeElimination
from tests.conftest import ARCHS
from tests.passes.harness import assert_same_function, copy_graph, on_reference, random_step_inputs, run_pass, tiny_step_graph

aten = torch.ops.aten


def tied(config) -> int:
    """1 when export leaves a dead get_attr: with tied embeddings both uses read model.lm_head.weight,
    so model.model.embed_tokens.weight (the same tensor) is reached by nothing."""
    return int(config.tie_word_embeddings)


def reached_weights(graph: StepGraph) -> set[str]:
    return {n.target for n in graph.graph.nodes if n.op == "get_attr"}


def distinct_tensors(graph: StepGraph) -> int:
    return len({t.data_ptr() for t in graph.weights.values()})


@pytest.mark.parametrize("arch", ARCHS)
def test_captured_graph_has_nothing_dead_but_a_tied_name(arch):
    before, after, counts, ops_before, ops_after, config = run_pass(DeadCodeElimination(), arch)
    assert_same_function(before, after, config)  # logits and KV-cache writes
    # asserts and the guard call have no users but are side effects: they stay
    assert counts == {"nodes": tied(config), "weights": tied(config)}
    assert ops_after == ops_before
    assert distinct_tensors(after) == distinct_tensors(before) and set(after.weights) == reached_weights(after)


def add_dead_code(graph: StepGraph) -> None:
    """A dead weight feeding a dead mul, and a dead neg of the last hidden state."""
    output = next(n for n in graph.graph.nodes if n.op == "output")
    hidden = output.args[0][0].args[0]  # lm_head's input
    weight = graph.add_weight("dead_weight", torch.ones(4), like=output)
    with graph.graph.inserting_before(output):
        graph.graph.call_function(aten.mul.Tensor, (weight, 2.0))
        graph.graph.call_function(aten.neg.default, (hidden,))
    graph.recompile()


@pytest.mark.parametrize("arch", ARCHS)
def test_dead_node_and_weight_go(arch):
    graph, config = tiny_step_graph(arch)
    clean = copy_graph(graph)
    add_dead_code(graph)
    counts = DeadCodeElimination()(graph)
    assert counts == {"nodes": 3 + tied(config), "weights": 1 + tied(config)}
    assert "dead_weight" not in dict(graph.gm.named_parameters(remove_duplicate=False))
    assert distinct_tensors(graph) == distinct_tensors(clean) and set(graph.weights) == reached_weights(graph)
    assert_same_function(clean, graph, config, seeds=(1,))
    assert DeadCodeElimination()(graph) == {"nodes": 0, "weights": 0}


def attention_graph() -> tuple[StepGraph, fx.Node]:
    """attention(q, k, v, cache, ...) whose output nobody reads; the graph returns q."""
    graph = fx.Graph()
    names = ("q", "k", "v", "kv_cache", "positions", "slot_mapping", "block_tables", "seq_lens", "query_start_loc")
    inputs = [graph.placeholder(name) for name in names]
    attention = graph.call_function(torch.ops.graphllm.attention.default, (*inputs, 0.5, 0))
    graph.call_function(aten.neg.default, (inputs[0],))  # dead and pure: goes
    graph.output(inputs[0])
    return StepGraph(fx.GraphModule(torch.nn.Module(), graph), (), ()), attention


def test_attention_with_unused_output_stays_and_writes_the_cache():
    graph, attention = attention_graph()
    assert DeadCodeElimination()(graph) == {"nodes": 1, "weights": 0}
    assert attention in graph.graph.nodes
    q, k, v = torch.randn(2, 2, 4), torch.randn(2, 1, 4), torch.randn(2, 1, 4)
    cache, expected = torch.zeros(2, 2, 4, 1, 4), torch.zeros(2, 2, 4, 1, 4)
    slots = torch.tensor([5, 2])
    write_kv_cache(k, v, expected, slots)
    with on_reference():
        graph(q, k, v, cache, torch.tensor([0, 1]), slots, torch.tensor([[1, 0]]), torch.tensor([2]),
              torch.tensor([0, 2]))
    torch.testing.assert_close(cache, expected)
    assert cache.abs().sum() > 0


def test_kv_cache_still_written_after_dce_of_dead_code():
    graph, config = tiny_step_graph("mistral")
    clean = copy_graph(graph)
    add_dead_code(graph)
    DeadCodeElimination()(graph)
    inputs = random_step_inputs(config, seed=4)
    caches = [c.clone() for c in inputs[-1]]
    with on_reference():
        graph(*inputs[:-1], caches)
    assert all(not torch.equal(a, b) for a, b in zip(caches, inputs[-1]))  # every layer wrote its cache
    assert_same_function(clean, graph, config, seeds=(4,))
