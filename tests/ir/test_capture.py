"""Capture keeps the model's function, its module paths and its weights."""

import torch

from graphllm.ir import diff_graphs, format_graph, op_counts
from tests.passes.harness import assert_same_function, on_reference, random_step_inputs, tiny_step_graph


def test_captured_graph_equals_eager_model(tiny_model_dir):
    from graphllm.ir import StepModule
    from graphllm.models import load_model
    graph, config = tiny_step_graph("qwen3")
    model, _ = load_model(tiny_model_dir("qwen3")[0])
    inputs = random_step_inputs(config, seed=5)
    eager_caches = [c.clone() for c in inputs[-1]]
    with on_reference():
        expected = StepModule(model)(*inputs[:-1], eager_caches)
        got = graph(*inputs)
    torch.testing.assert_close(got, expected)
    for a, b in zip(inputs[-1], eager_caches):
        torch.testing.assert_close(a, b)


def test_one_attention_node_per_layer_and_module_paths():
    graph, config = tiny_step_graph("llama")
    counts = op_counts(graph.gm)
    assert counts["attention.default"] == config.num_hidden_layers
    assert counts["linear.default"] == 7 * config.num_hidden_layers + 1
    text = format_graph(graph.gm)
    assert "# model.model.layers.1.self_attn.attn" in text and "# model.model.layers.0.mlp.down_proj" in text


def test_graph_serves_every_batch_shape():
    """One graph for every batch: logits of each sampled row, and each new token's K/V in its slot."""
    graph, config = tiny_step_graph("llama")
    for seed, num_seqs in ((1, 1), (2, 2), (3, 5)):
        inputs = random_step_inputs(config, seed, num_seqs=num_seqs)
        before = [c.clone() for c in inputs[-1]]
        with on_reference():
            logits = graph(*inputs)
        assert logits.shape == (num_seqs, config.vocab_size) and torch.isfinite(logits).all()
        slots = inputs[2]  # slot_mapping: every new token's K and V were written there
        for old, new in zip(before, inputs[-1]):
            flat_old, flat_new = old.flatten(1, 2), new.flatten(1, 2)  # [2, slots, Hkv, D]
            assert not torch.equal(flat_new[:, slots], flat_old[:, slots])
            untouched = torch.ones(flat_new.shape[1], dtype=torch.bool)
            untouched[slots] = False
            assert torch.equal(flat_new[:, untouched], flat_old[:, untouched])


def test_weights_follow_the_graph():
    graph, _ = tiny_step_graph("qwen2")  # tied embeddings: two names, one storage
    weights = graph.weights
    assert weights["model.lm_head.weight"].data_ptr() == weights["model.model.embed_tokens.weight"].data_ptr()
    assert weights["model.model.layers.0.self_attn.q_proj.bias"].shape == (64,)


def test_diff_shows_changed_lines():
    graph, config = tiny_step_graph("llama")
    before = format_graph(graph.gm)
    node = next(n for n in graph.graph.nodes if n.op == "call_function" and "silu" in str(n.target))
    node.target = torch.ops.aten.relu.default
    graph.recompile()
    diff = diff_graphs(before, graph.gm)
    assert "-" in diff and "relu" in diff and "silu" in diff
    assert_same_function(graph, graph, config, seeds=(1,))


def test_limits_below_the_example_step_still_capture(tiny_model_dir):
    """Regression: max_num_seqs 1 or a 4-token budget made export refuse the 3-sequence, 9-token example."""
    from graphllm.ir.capture import capture
    from graphllm.models import load_model
    model, config = load_model(tiny_model_dir("llama")[0])
    graph = capture(model, config, torch.float32, torch.device("cpu"), max_num_tokens=4, max_num_seqs=1,
                    max_blocks_per_seq=2)
    assert op_counts(graph.gm)["attention.default"] == config.num_hidden_layers
