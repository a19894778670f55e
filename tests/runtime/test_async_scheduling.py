"""Async scheduling (EngineConfig.async_scheduling): each step call launches one step and reads
back the one before. It must change when tokens are read, never which tokens come out: every
test runs the same requests through an engine with it and one without, and compares everything
the outputs hold."""

import pytest

from graphllm import Engine, SamplingParams
from graphllm.runtime.sequence import PENDING

PROMPTS = [[1, 5, 9, 17], [1, 42, 43], [1, 60, 61, 62, 63, 64], [1, 7], [1, 99, 98, 97, 96, 95, 94, 93, 92]]


def engines(path, **options):
    return (Engine.from_pretrained(path, async_scheduling=True, **options),
            Engine.from_pretrained(path, async_scheduling=False, **options))


def outputs(engine, prompts, params):
    outs = engine.generate(prompts, params)
    assert not engine.has_unfinished_requests()
    assert engine.pool.num_free_blocks == engine.pool.num_blocks  # every block back, wasted rows included
    return [(c.token_ids, c.text, c.finish_reason, c.stop_reason,
             None if c.logprobs is None else [sorted((t, round(lp.logprob, 5), lp.rank) for t, lp in e.items())
                                              for e in c.logprobs])
            for o in outs for c in o.outputs]


@pytest.fixture(scope="module")
def llama(tiny_model_dir):
    return tiny_model_dir("llama")[0]


def test_the_async_engine_overlaps(llama):
    on, off = engines(llama)
    assert on.async_scheduling and not off.async_scheduling
    queued = Engine.from_pretrained(llama, async_scheduling=True, num_decode_steps=4)
    assert not queued.async_scheduling  # queued decode steps overlap the host their own way


def test_mixed_sampling_stops_and_lengths_match_the_synchronous_engine(llama):
    # greedy rows finish by max_tokens at different steps; one row samples with a seed; one stops
    # on EOS (not ignored) or a stop string; one asks for logprobs, which samples on the host
    params = [SamplingParams(temperature=0, max_tokens=5, ignore_eos=True),
              SamplingParams(temperature=0.8, seed=11, max_tokens=17, ignore_eos=True),
              SamplingParams(temperature=0, max_tokens=30),
              SamplingParams(temperature=0, max_tokens=9, logprobs=3, ignore_eos=True),
              SamplingParams(temperature=0, max_tokens=23, stop=["w7"], min_tokens=2)]
    on, off = engines(llama)
    assert outputs(on, PROMPTS, params) == outputs(off, PROMPTS, params)


def test_preemption_and_chunked_prefill_with_tokens_in_flight(llama):
    # 6 blocks of 16 tokens for 5 sequences growing to ~45 tokens: sequences are preempted while
    # their newest token is still on the device; 8-token budget: prompts arrive in chunks
    params = SamplingParams(temperature=0, max_tokens=36, ignore_eos=True)
    options = dict(num_kv_blocks=6, max_num_batched_tokens=8, max_num_seqs=4, max_model_len=64)
    on, off = engines(llama, **options)
    got = outputs(on, PROMPTS, params)
    assert got == outputs(off, PROMPTS, params)
    assert on.scheduler.num_preemptions > 0


def test_sequences_end_at_max_model_len_without_an_extra_step(llama):
    # the last token's step is never followed by one past max_model_len (no block for it)
    params = SamplingParams(temperature=0, max_tokens=None, ignore_eos=True)
    on, off = engines(llama, max_model_len=20, num_kv_blocks=len(PROMPTS) * 2)
    got = outputs(on, PROMPTS, params)
    assert got == outputs(off, PROMPTS, params)
    assert all(reason == "length" and len(PROMPTS[i]) + len(ids) == 20 for i, (ids, _, reason, *_) in enumerate(got))


def test_progress_reports_hold_only_tokens_read_back(llama):
    engine = Engine.from_pretrained(llama, async_scheduling=True)
    batches, execute = [], engine.runner.execute
    engine.runner.execute = lambda batch, *a: batches.append(len(batch)) or execute(batch, *a)
    rid = engine.add_request(PROMPTS[0], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    seen, final = [], None
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens = out.outputs[0].token_ids
            assert PENDING not in list(tokens)
            seen.append(len(tokens))
            final = out
    assert seen == [1, 2, 3, 4, 5, 6] and final.finished and final.request_id == rid
    assert batches == [1] * 6  # the prefill and 5 decode steps: none after the last token's step
    off = Engine.from_pretrained(llama, async_scheduling=False)
    assert final.outputs[0].token_ids == off.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=6,
                                                                                 ignore_eos=True))[0].outputs[0].token_ids


def test_abort_while_a_token_is_in_flight(llama):
    engine = Engine.from_pretrained(llama, async_scheduling=True)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    keep, drop = engine.add_request(PROMPTS[0], params), engine.add_request(PROMPTS[1], params)
    engine.step()
    engine.step()  # drop's second token is on the device now
    assert engine.requests[drop].seqs[0].pending_row is not None
    engine.abort(drop)
    finished = {}
    while engine.has_unfinished_requests():
        finished.update((o.request_id, o) for o in engine.step() if o.finished)
    assert list(finished) == [keep] and len(finished[keep].outputs[0].token_ids) == 12
    assert engine.pool.num_free_blocks == engine.pool.num_blocks
    off = Engine.from_pretrained(llama, async_scheduling=False)
    assert finished[keep].outputs[0].token_ids == off.generate(PROMPTS[0], params)[0].outputs[0].token_ids
