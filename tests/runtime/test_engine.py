"""The Engine API end to end on a tiny random Llama: sampling, stops, logprobs, n, streaming."""

import asyncio
import json

import pytest
import torch

from graphllm import Engine, SamplingParams
from graphllm.runtime.requests import Request

PROMPTS = [[1, 5, 9, 17], [1, 42, 43], [1, 60, 61, 62, 63, 64]]


@pytest.fixture(scope="module")
def setup(tiny_model_dir):
    path, hf = tiny_model_dir("llama")
    return Engine.from_pretrained(path), hf


@pytest.fixture
def engine(setup):
    engine = setup[0]
    yield engine
    assert not engine.has_unfinished_requests()
    assert engine.pool.num_free_blocks == engine.pool.num_blocks  # every block back in the pool


def tokens(outs):
    return [c.token_ids for o in outs for c in o.outputs]


def test_same_seed_same_tokens_whatever_the_batch(engine):
    seeded = SamplingParams(temperature=1.0, seed=7, max_tokens=16, ignore_eos=True)
    alone = tokens(engine.generate([PROMPTS[0]], seeded))
    other = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True)
    in_batch = engine.generate(PROMPTS, [seeded, other, other])[0]
    assert tokens([in_batch]) == alone
    assert tokens(engine.generate([PROMPTS[0]], SamplingParams(temperature=1.0, seed=8, max_tokens=16,
                                                              ignore_eos=True))) != alone


def test_top_k_one_is_greedy(engine):
    greedy = engine.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    top1 = engine.generate(PROMPTS, SamplingParams(temperature=1.3, top_k=1, max_tokens=12, ignore_eos=True))
    assert tokens(greedy) == tokens(top1)


def test_logprobs_equal_log_softmax_of_model_logits(setup, engine):
    hf = setup[1]
    out = engine.generate([PROMPTS[2]], SamplingParams(temperature=1.0, seed=3, max_tokens=8, logprobs=5,
                                                       ignore_eos=True))[0].outputs[0]
    ids = torch.tensor([PROMPTS[2] + out.token_ids[:-1]])
    with torch.no_grad():
        ref = hf(ids).logits[0, len(PROMPTS[2]) - 1:].log_softmax(-1)  # [8, V]
    for step, (token, entry) in enumerate(zip(out.token_ids, out.logprobs)):
        assert entry[token].logprob == pytest.approx(ref[step, token].item(), abs=1e-4)
        top5 = ref[step].topk(5).indices.tolist()
        assert set(top5) <= set(entry)
        assert [entry[t].rank for t in top5] == [1, 2, 3, 4, 5]
        assert entry[token].rank == int((ref[step] > ref[step, token]).sum()) + 1


def test_stop_string_cuts_text_exactly(engine):
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    full = engine.generate([PROMPTS[1]], params)[0].outputs[0].text
    words = full.split()
    stop = f"{words[4]} {words[5][:1]}"  # spans two tokens and ends inside one
    cut = engine.generate([PROMPTS[1]], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True,
                                                        stop=[stop]))[0].outputs[0]
    assert cut.text == full[:full.index(stop)]
    assert cut.finish_reason == "stop" and cut.stop_reason == stop
    kept = engine.generate([PROMPTS[1]], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, stop=[stop],
                                                         include_stop_str_in_output=True))[0].outputs[0]
    assert kept.text == full[:full.index(stop) + len(stop)]


def test_stop_token_ids_and_max_tokens(engine):
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    full = engine.generate([PROMPTS[0]], params)[0].outputs[0]
    assert full.finish_reason == "length" and len(full.token_ids) == 10
    stop_at = full.token_ids[3]
    first = full.token_ids.index(stop_at)
    out = engine.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True,
                                                        stop_token_ids=[stop_at]))[0].outputs[0]
    assert out.token_ids == full.token_ids[:first + 1]
    assert out.finish_reason == "stop" and out.stop_reason == stop_at


def test_min_tokens_holds_back_stop_tokens(engine):
    full = engine.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))[0]
    stop_at = full.outputs[0].token_ids[0]
    out = engine.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=10, min_tokens=4,
                                                        stop_token_ids=[stop_at], ignore_eos=True))[0]
    ids = out.outputs[0].token_ids
    assert len(ids) >= 4 and stop_at not in ids[:4]


def test_stop_strings_count_only_past_min_tokens(engine):
    """Regression (s38's fuzzing): a stop string in the text of the first min_tokens tokens ended the request there
    (2 tokens of min_tokens=6). Like stop ids, a stop string counts only once it ends in the text of a token past
    min_tokens (vLLM's rule); it may start before."""
    full = engine.generate([PROMPTS[1]], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0].outputs[0]
    head = engine.generate([PROMPTS[1]], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))[0].outputs[0]
    for stop in (full.text.split()[1], head.text[-3:] + full.text[len(head.text):][:2]):  # in token 2; across 6|7
        out = engine.generate([PROMPTS[1]], SamplingParams(temperature=0, max_tokens=12, min_tokens=6,
                                                            ignore_eos=True, stop=[stop]))[0].outputs[0]
        start = full.text.find(stop, len(head.text) - len(stop) + 1)  # the first match ending past the 6 tokens
        assert out.token_ids[:6] == full.token_ids[:6] and len(out.token_ids) > 6
        if start < 0:
            assert (out.text, out.finish_reason, out.token_ids) == (full.text, "length", full.token_ids)
        else:
            assert (out.text, out.finish_reason, out.stop_reason) == (full.text[:start], "stop", stop)


def test_n_gives_distinct_reproducible_samples(engine):
    params = SamplingParams(n=3, temperature=1.0, seed=11, max_tokens=12, ignore_eos=True)
    first = engine.generate([PROMPTS[0]], params)[0]
    assert [c.index for c in first.outputs] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in first.outputs}) == 3
    assert tokens(engine.generate([PROMPTS[0]], params)) == tokens([first])


def test_text_prompts_and_prompt_too_long(engine):
    out = engine.generate("w3 w4 w5", SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))[0]
    assert out.prompt == "w3 w4 w5" and out.prompt_token_ids[-3:] == [6, 7, 8]
    with pytest.raises(ValueError, match="max_model_len"):
        engine.add_request(list(range(3, 100)) * 3)
    # text the tokenizer turns into nothing (this tiny one adds no BOS) is refused, not run as an empty step
    with pytest.raises(ValueError, match="tokenizes to no tokens"):
        engine.add_request("")
    assert engine.generate("w3", SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))[0].outputs[0].token_ids


def test_stream_deltas_add_up_to_generate(engine):
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    expected = engine.generate([PROMPTS[2]], params)[0].outputs[0].text

    async def collect():
        return [out async for out in engine.stream(PROMPTS[2], params)]

    outs = asyncio.run(collect())
    assert outs[-1].finished and not any(o.finished for o in outs[:-1])
    assert "".join(o.outputs[0].delta_text for o in outs) == expected == outs[-1].outputs[0].text


def test_concurrent_streams_and_early_exit_free_blocks(engine):
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)

    async def consume(prompt, stop_after):
        count = 0
        async for out in engine.stream(prompt, params):
            count += 1
            if count == stop_after:
                break
        return out

    async def main():
        return await asyncio.gather(*(consume(p, 3 if i % 2 else None) for i, p in enumerate(PROMPTS * 2)))

    outs = asyncio.run(main())
    assert [o.finished for o in outs] == [True, False] * 3


class WatchedList(list):
    """A list that records how many items each slice or iteration of it reads."""

    def __init__(self, items):
        super().__init__(items)
        self.reads = []

    def __getitem__(self, i):
        if isinstance(i, slice):
            self.reads.append(len(range(*i.indices(len(self)))))
        return super().__getitem__(i)

    def __iter__(self):
        self.reads.append(len(self))
        return super().__iter__()


def test_step_copies_no_token_list(engine):
    """Regression: each step copied every sequence's prompt, output and logprobs lists (for the
    sampler's rows and for the snapshots), host work that grew with the sequence's length."""
    greedy = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    sampled = SamplingParams(temperature=1.0, seed=5, top_k=8, logprobs=2, max_tokens=30, ignore_eos=True)
    ids = [engine.add_request(PROMPTS[2], greedy), engine.add_request(PROMPTS[0], sampled)]
    for _ in range(20):
        engine.step()
    lists = []
    for seq in (engine.requests[i].seqs[0] for i in ids):
        assert seq.num_output_tokens == 20
        for name in ("token_ids", "prompt_token_ids", "output_token_ids", "logprobs"):
            if vars(seq).get(name) is not None:
                lists.append(WatchedList(vars(seq)[name]))
                setattr(seq, name, lists[-1])
    outs = engine.step()
    assert sorted(o.request_id for o in outs) == sorted(ids) and not any(o.finished for o in outs)
    assert max((n for watched in lists for n in watched.reads), default=0) <= 1  # the one new token
    while engine.has_unfinished_requests():
        engine.step()


def test_stream_outputs_are_frozen_snapshots(engine):
    params = SamplingParams(temperature=1.0, seed=2, logprobs=1, max_tokens=10, ignore_eos=True)

    async def collect():
        return [out async for out in engine.stream(PROMPTS[1], params)]

    outs = [o.outputs[0] for o in asyncio.run(collect())]
    final = outs[-1]
    assert type(final.token_ids) is list and type(final.logprobs) is list and json.dumps(final.token_ids)
    for step, c in enumerate(outs, 1):  # held since they were handed out: nothing appended shows
        assert len(c.token_ids) == len(c.logprobs) == step
        assert c.token_ids == final.token_ids[:step] and list(c.logprobs) == final.logprobs[:step]


def test_generate_snapshots_only_finished_requests(engine, monkeypatch):
    calls = []
    snapshot = Request.snapshot
    monkeypatch.setattr(Request, "snapshot", lambda self: calls.append(self.finished) or snapshot(self))
    outs = engine.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    assert calls == [True] * 3 and all(len(o.outputs[0].token_ids) == 12 for o in outs)


@pytest.mark.parametrize("prompts", [None, 5, {"a": 1}, [1.5, 2.0], b"w1 w2", [True, False], [PROMPTS[0], [1, 10**6]]])
def test_bad_prompts_are_value_errors_and_leave_nothing_queued(engine, prompts):
    """Regression (s35's fuzzing): None / 5 / a dict failed with TypeError or KeyError, bytes and bools passed as token
    ids, and a batch whose second prompt was refused left its first queued to run in the next call (the fixture
    checks that nothing is left)."""
    with pytest.raises(ValueError):
        engine.generate(prompts, SamplingParams(max_tokens=2))


def test_a_text_prompt_past_the_models_vocabulary_is_refused(engine, monkeypatch):
    """Regression (s35's fuzzing): a tokenizer with more ids than the model's embedding (a mismatched folder) made an
    index error inside the step, and the sequence stayed to fail every later step."""
    vocab = engine.state.model_config.vocab_size
    monkeypatch.setattr(engine.tokenizer, "encode", lambda text: [1, vocab + 3])
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        engine.generate("anything", SamplingParams(max_tokens=2))


def test_a_failing_step_leaves_no_request_behind(engine, monkeypatch):
    step = engine.step
    monkeypatch.setattr(engine, "step", lambda: (_ for _ in ()).throw(RuntimeError("injected")))
    with pytest.raises(RuntimeError, match="injected"):
        engine.generate(PROMPTS, SamplingParams(max_tokens=2))
    assert not engine.has_unfinished_requests()
    monkeypatch.setattr(engine, "step", step)
    assert len(engine.generate(PROMPTS, SamplingParams(max_tokens=2))) == len(PROMPTS)


@pytest.mark.parametrize("params", [{"max_tokens": 4}, SamplingParams(stop_token_ids=[10**6])])
def test_bad_params_are_value_errors(engine, params):
    with pytest.raises(ValueError):
        engine.generate(PROMPTS[0], params)
