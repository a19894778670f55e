"""cudagraph_mode FULL (the default since 2026-12-01) beside the engine's other features, on CPU: an engine whose
prompt-carrying steps go through the mixed-step runner (MixedGraphRunner with StepReplay in place of graphs: the
same staging, padding and logits buffer) gives the same outputs as the plain engine under prefix caching, chunked
prefill, preemption, n > 1, seeded sampling, penalties, logprobs and stops, and under speculative decoding (whose
verify steps, more logits rows than sequences, stay outside the runner)."""

import pytest

from graphllm import Engine, SamplingParams
from graphllm.runtime.mixed_graphs import MixedGraphRunner
from tests.runtime.test_spec_decode import MIXED, NGRAM, PROMPTS, assert_same, run

SHARED = list(range(3, 30))  # a prefix of 27 tokens: three full blocks of 8 cached for the later prompts
CACHED = [SHARED + [40, 41], SHARED + [50], SHARED + [60, 61, 62, 63, 64, 65], [1, 42, 43]]
SAMPLED = [SamplingParams(temperature=0.8, seed=3, n=2, max_tokens=12, ignore_eos=True),
           SamplingParams(temperature=0.7, top_p=0.9, seed=5, max_tokens=10, logprobs=2, ignore_eos=True)]


def with_mixed_runner(engine: Engine, buckets: tuple[int, ...] = (8, 16, 32, 64)) -> list[tuple[int, int]]:
    """Send the engine's prompt-carrying steps through a captured (StepReplay) mixed-step runner; the list it
    returns fills with the (tokens, sequences) of every step the runner replays."""
    state, inner = engine.state, engine.runner
    mixed = MixedGraphRunner(inner.step, inner.kv_caches, buckets, state.limits.max_num_seqs + 1,
                             -(-state.max_model_len // state.limits.block_size), state.num_kv_blocks,
                             state.limits.block_size, state.device, inner.backend)
    mixed.capture()
    seen, replay = [], mixed.run
    mixed.run = lambda host, fill=None: seen.append((len(host.input_ids), host.num_seqs)) or replay(host, fill)
    inner.mixed_graphs = mixed
    return seen


def engines(path, **options) -> tuple[Engine, Engine, list]:
    plain = Engine.from_pretrained(path, dtype="float32", **options)
    full = Engine.from_pretrained(path, dtype="float32", **options)
    return plain, full, with_mixed_runner(full)


@pytest.mark.parametrize("options", [
    {"block_size": 8, "max_num_batched_tokens": 16},  # chunked prefill over cached and uncached blocks
    # 12 blocks: with 14 nobody was preempted once a prompt in flight was computed once (the scheduler, s38)
    {"block_size": 8, "num_kv_blocks": 12, "max_num_seqs": 4, "max_model_len": 64, "max_num_batched_tokens": 32},
    {"block_size": 8, "max_num_batched_tokens": 16, "async_scheduling": False},
], ids=["chunked", "preemption", "sync"])
def test_cached_prefixes_preemption_and_sampling_give_the_plain_engines_outputs(tiny_model_dir, options):
    plain, full, seen = engines(tiny_model_dir("llama")[0], **options)
    for params in [MIXED, *SAMPLED]:
        assert_same(run(full, CACHED, params), run(plain, CACHED, params))
        assert_same(run(full, CACHED, params), run(plain, CACHED, params))  # again, from a warm prefix cache
    assert seen and full.pool.prefix_cache_hits > 0
    assert full.pool.prefix_cache_hits == plain.pool.prefix_cache_hits
    if "num_kv_blocks" in options:
        assert full.scheduler.num_preemptions > 0 and full.scheduler.num_preemptions == plain.scheduler.num_preemptions


def test_speculative_decoding_keeps_its_verify_steps_outside_the_runner(tiny_model_dir):
    options = dict(speculative_config={**NGRAM, "num_speculative_tokens": 2}, max_num_batched_tokens=16)
    plain, full, seen = engines(tiny_model_dir("llama")[0], **options)
    assert_same(run(full, PROMPTS, MIXED), run(plain, PROMPTS, MIXED))
    assert seen and full.stats().spec_decode.num_drafts > 0
    assert full.stats().spec_decode.num_accepted_tokens == plain.stats().spec_decode.num_accepted_tokens
    assert full.runner.mixed_graphs.replays == len(seen)
