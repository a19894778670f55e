"""num_decode_steps > 1: greedy decode steps queued back to back give the tokens, texts and stops
of one step at a time, eager and compiled, and leave every KV block free."""

import pytest

from graphllm import Engine, SamplingParams

PROMPTS = [[1, 5, 9, 17], [1, 42, 43], [1, 60, 61, 62, 63, 64], [1, 7]]


def greedy(max_tokens, **kw):
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, **kw)


def outputs(engine, params):
    outs = engine.generate(PROMPTS, params)
    assert not engine.has_unfinished_requests()
    assert engine.pool.num_free_blocks == engine.pool.num_blocks
    return [(c.token_ids, c.text, c.finish_reason, c.stop_reason) for o in outs for c in o.outputs]


def params_set(engine_one):
    """Lengths that end mid-burst, a stop token, a stop string, and a sampled row in the batch."""
    full = engine_one.generate([PROMPTS[1]], greedy(30))[0].outputs[0]
    stop_string = full.text.split()[5][:2]
    return [
        [greedy(n) for n in (1, 7, 13, 30)],
        [greedy(30, stop_token_ids=[full.token_ids[9]]), greedy(30, stop=[stop_string]), greedy(5), greedy(30)],
        [greedy(20), SamplingParams(temperature=0.8, seed=3, max_tokens=20), greedy(9), greedy(20)],
    ]


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_same_outputs_as_single_steps(tiny_model_dir, compiled_dir, compiled):
    path, _ = tiny_model_dir("llama")
    make = (lambda k: Engine.load(compiled_dir("llama"), num_decode_steps=k)) if compiled else \
        (lambda k: Engine.from_pretrained(path, num_decode_steps=k))
    one, four = make(1), make(4)
    calls = []
    inner = four.runner.execute_decode_steps
    four.runner.execute_decode_steps = lambda batch, n: calls.append(n) or inner(batch, n)
    for params in params_set(one):
        assert outputs(four, params) == outputs(one, params)
    assert calls and max(calls) == 4 and min(calls) >= 2  # bursts of 4, shorter near max_tokens


def test_only_plain_greedy_decode_batches_run_several_steps(tiny_model_dir):
    path, _ = tiny_model_dir("llama")
    engine = Engine.from_pretrained(path, num_decode_steps=8)
    seen = []
    inner = engine.runner.execute_decode_steps
    engine.runner.execute_decode_steps = lambda batch, n: seen.append(n) or inner(batch, n)
    engine.generate(PROMPTS[:2], SamplingParams(temperature=0.7, seed=1, max_tokens=12))
    engine.generate(PROMPTS[:2], greedy(12, logprobs=2))
    engine.generate(PROMPTS[:2], greedy(12, repetition_penalty=1.3))
    assert seen == []
    engine.generate(PROMPTS[:2], greedy(12))
    assert seen == [8, 3]  # after the prefill's token: 8, then the 3 left of max_tokens


def test_a_backend_that_plans_every_step_gets_single_steps(tiny_model_dir):
    path, _ = tiny_model_dir("llama")
    engine = Engine.from_pretrained(path, num_decode_steps=8)
    engine.runner.backend.plans_on_host = True  # as FlashInfer's: its plan for a queued step would clobber the last
    seen = []
    inner = engine.runner.execute_decode_steps
    engine.runner.execute_decode_steps = lambda batch, n: seen.append(n) or inner(batch, n)
    engine.generate(PROMPTS[:2], greedy(12))
    assert seen == []
