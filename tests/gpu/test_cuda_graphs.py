"""On a GPU: compiled steps replayed from CUDA graphs give the eager engine's and transformers'
greedy tokens (float32), with batches padded up to their bucket."""

import pytest
import torch

from graphllm import Engine, SamplingParams
from tests.gpu.helpers import transformers_greedy

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

PROMPTS = [[1, 5, 9, 17, 33], [1, 42], list(range(3, 40))]  # 3 sequences: replayed in bucket 4
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def tokens(outs):
    return [o.outputs[0].token_ids for o in outs]


@pytest.mark.parametrize("arch", ["llama", "qwen3", "mixtral", "qwen3_moe-mixed", "gemma2", "gemma3", "olmo2", "phi3"])
# MoE: the Triton fused_moe; Gemma: the soft-capped, per-layer-window Triton attention
def test_graphs_match_eager_and_transformers(arch, tiny_model_dir, compiled_dir):
    path, hf = tiny_model_dir(arch)
    expected = transformers_greedy(hf, PROMPTS, max_new_tokens=24)
    eager = Engine.from_pretrained(path, dtype="float32", cuda_graphs=False)
    graphed = Engine.load(compiled_dir(arch))
    assert graphed.runner.graphs is not None and graphed.state.device.type == "cuda"
    assert tokens(eager.generate(PROMPTS, GREEDY)) == expected
    assert tokens(graphed.generate(PROMPTS, GREEDY)) == expected
    assert graphed.runner.graphs.replays > 0
    assert graphed.pool.num_free_blocks == graphed.pool.num_blocks


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_queued_decode_steps_replay_graphs_with_the_same_tokens(backend, tiny_model_dir, compiled_dir):
    """num_decode_steps=8: graph replays queued back to back, argmax fed on the device, give
    transformers' tokens; stopping mid-burst on max_tokens (varied per request) drops the rest."""
    path, hf = tiny_model_dir("llama")
    expected = transformers_greedy(hf, PROMPTS, max_new_tokens=24)
    engine = Engine.load(compiled_dir("llama"), attention_backend=backend, num_decode_steps=8)
    queued, inner = [], engine.runner.graphs.run_steps
    engine.runner.graphs.run_steps = lambda hosts: queued.append(len(hosts)) or inner(hosts)
    outs = engine.generate(PROMPTS, [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (24, 11, 19)])
    assert tokens(outs) == [expected[0], expected[1][:11], expected[2][:19]]
    assert queued == [8, 2, 8, 5]  # after the prefill's token: bursts cut at the nearest max_tokens
    assert engine.pool.num_free_blocks == engine.pool.num_blocks


def test_async_scheduling_replays_graphs_with_transformers_tokens(tiny_model_dir, compiled_dir):
    """Async scheduling on the GPU: graph replays whose input ids are copied on the device from the
    step still in flight, mixed steps (a prompt arriving while others decode), preemption (5 KV
    blocks for 3 sequences that need 7) and rows stopping at different max_tokens all give
    transformers' tokens, and the same as the synchronous engine."""
    path, hf = tiny_model_dir("llama")
    expected = transformers_greedy(hf, PROMPTS, max_new_tokens=24)
    lengths = (24, 11, 19)
    results = {}
    for overlap in (True, False):
        engine = Engine.load(compiled_dir("llama"), attention_backend="triton", async_scheduling=overlap,
                             num_kv_blocks=5, max_model_len=64)
        assert engine.async_scheduling is overlap
        ids = [engine.add_request(p, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
               for p, n in zip(PROMPTS[:2], lengths)]
        finished = {}
        for step in range(200):
            if step == 5:  # the long prompt arrives while the others decode: a mixed step
                ids.append(engine.add_request(PROMPTS[2], SamplingParams(temperature=0, max_tokens=lengths[2],
                                                                         ignore_eos=True)))
            finished.update((o.request_id, o) for o in engine.step() if o.finished)
            if step > 5 and not engine.has_unfinished_requests():
                break
        results[overlap] = [finished[i].outputs[0].token_ids for i in ids]
        assert engine.runner.graphs.replays > 0 and engine.scheduler.num_preemptions > 0
        assert engine.pool.num_free_blocks == engine.pool.num_blocks
    assert results[True] == [e[:n] for e, n in zip(expected, lengths)]
    assert results[True] == results[False]


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_verify_steps_replay_their_own_graphs_with_transformers_tokens(backend, tiny_model_dir, compiled_dir):
    """Speculative decoding (the target as its own draft, k = 3): verify steps of 1 + k tokens a sequence
    replay the verify graphs, padded per bucket, and greedy tokens stay transformers'."""
    path, hf = tiny_model_dir("llama")
    expected = transformers_greedy(hf, PROMPTS, max_new_tokens=24)
    engine = Engine.load(compiled_dir("llama"), attention_backend=backend,
                         speculative_config={"model": str(path), "num_speculative_tokens": 3})
    assert [g.q for g in engine.runner.verify_graphs] == [2, 3, 4]
    assert tokens(engine.generate(PROMPTS, GREEDY)) == expected
    assert engine.runner.verify_graphs[-1].replays > 0
    assert engine.spec_decoder.proposer.runner.graphs.replays > 0  # the draft's decode steps: its own graphs
    assert engine.pool.num_free_blocks == engine.pool.num_blocks
