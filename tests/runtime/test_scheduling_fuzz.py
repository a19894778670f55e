"""Randomized workloads over the scheduling core: scheduler, block pool (prefix caching), step loop, stops and
detokenizer, driven through the Engine API on the tiny Llama.

Each seed draws requests (shared prefixes, prompts of max_model_len - 1 tokens, identical prompts at once, greedy
and seeded sampling with n > 1, stop strings across token boundaries, stop ids, min_tokens, max_tokens=1,
logprobs, penalties) that arrive at random steps, aborts some of them at random points and slips in requests
that must be refused. After every step the pool's bookkeeping must match the sequences' block tables; at the end
every block is free. What comes out must not depend on how it was scheduled: each request's outputs equal those
of the request run alone on a plain engine (synchronous, no prefix caching, a large pool), and a greedy
request's stops are checked against its unstopped tokens. The seeds are fixed, so a failure reproduces.
"""

import collections
import dataclasses
import random

import pytest

from graphllm import Engine, SamplingParams
from graphllm.runtime.detokenizer import IncrementalDetokenizer
from graphllm.runtime.sequence import PENDING, SequenceStatus
from tests.tiny_models import VOCAB

MAX_MODEL_LEN = 48
SHARED = [[1] + list(range(30, 30 + k)) for k in (3, 9, 20)]  # prefixes many prompts share: prefix-cache hits

CONFIGS = {  # each with two seeds of its own; every config runs the same kinds of workload
    "caching-chunked": dict(enable_prefix_caching=True, max_num_batched_tokens=7, block_size=4),
    "sync-no-caching": dict(enable_prefix_caching=False, async_scheduling=False, max_num_batched_tokens=16),
    # 13 blocks of 4 tokens for up to 8 sequences of up to 48: preemption (and eviction) with tokens in flight
    "preemption": dict(num_kv_blocks=13, block_size=4, max_num_seqs=8, max_num_batched_tokens=16),
    "preemption-sync": dict(num_kv_blocks=6, block_size=8, max_num_seqs=4, async_scheduling=False),
    "decode-steps": dict(num_decode_steps=3, num_kv_blocks=16, block_size=4, max_num_batched_tokens=9),
    "ngram-spec": dict(speculative_config={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
                                           "prompt_lookup_min": 1}, num_kv_blocks=16, block_size=4),
    "tiny-budgets": dict(block_size=3, max_num_batched_tokens=2, max_num_seqs=2, num_kv_blocks=17),
}


@pytest.fixture(scope="module")
def llama(tiny_model_dir):
    return tiny_model_dir("llama")[0]


@pytest.fixture(scope="module")
def plain(llama):
    """The reference: one request at a time, synchronous, no prefix caching, a pool that never runs dry."""
    return Engine.from_pretrained(llama, async_scheduling=False, enable_prefix_caching=False,
                                  max_model_len=MAX_MODEL_LEN)


def random_prompt(rng: random.Random) -> list[int]:
    kind = rng.random()
    if kind < 0.1:
        return [rng.randrange(3, VOCAB) for _ in range(MAX_MODEL_LEN - 1)]  # the longest a prompt may be
    if kind < 0.5:
        return rng.choice(SHARED) + [rng.randrange(3, VOCAB) for _ in range(rng.randint(0, 6))]
    return [rng.randrange(3, VOCAB) for _ in range(rng.randint(1, 20))]


def random_params(rng: random.Random) -> SamplingParams:
    max_tokens = rng.choice([1, 2, 5, 12, 30, None])
    kw = dict(max_tokens=max_tokens, ignore_eos=rng.random() < 0.7)
    if max_tokens and rng.random() < 0.3:
        kw["min_tokens"] = rng.randint(0, max_tokens)
    if rng.random() < 0.2:
        kw["stop_token_ids"] = [rng.randrange(3, VOCAB)]
    if rng.random() < 0.4:  # the tiny tokenizer's words are w0..w124, joined by spaces: most outputs hold these
        digit = rng.randrange(10)
        kw["stop"] = rng.choice([[f"{digit} w"], [f"w{digit}"], [f"{digit}"], ["1 w", "w9"], [f"{digit}{digit}"]])
        kw["include_stop_str_in_output"] = rng.random() < 0.3
    if rng.random() < 0.4:
        kw.update(temperature=0.8, seed=rng.randrange(100), n=rng.choice([1, 2, 3]))
    else:
        kw["temperature"] = 0
    if rng.random() < 0.1:
        kw["logprobs"] = 2
    if rng.random() < 0.1:
        kw["repetition_penalty"] = 1.5
    return SamplingParams(**kw)


def random_workload(rng: random.Random) -> list[tuple[int, list[int], SamplingParams]]:
    """(arrival step, prompt, params), by arrival; some rounds bring the same prompt several times at once."""
    requests = [(rng.randint(0, 10), random_prompt(rng), random_params(rng)) for _ in range(rng.randint(6, 12))]
    prompt, params, step = random_prompt(rng), random_params(rng), rng.randint(0, 4)
    requests += [(step, prompt, params)] * rng.randint(2, 6)
    return sorted(requests, key=lambda r: r[0])


def check_pool(engine: Engine) -> None:
    """Every block's reference count is the number of live sequences holding it, free exactly when unreferenced;
    cached keys name their blocks; running sequences hold blocks for their computed tokens, waiting ones none."""
    pool, scheduler = engine.pool, engine.scheduler
    live = list(scheduler.running) + list(scheduler.waiting)
    assert len({id(seq) for seq in live}) == len(live)
    holders = collections.Counter(block for seq in live for block in seq.block_table)
    assert pool.ref_counts == [holders[block] for block in range(pool.num_blocks)]
    assert set(pool.free_blocks) == {block for block in range(pool.num_blocks) if not holders[block]}
    assert all(pool.block_keys[block] == key for key, block in pool.cached.items())
    for seq in scheduler.running:
        assert seq.status is SequenceStatus.RUNNING and len(set(seq.block_table)) == len(seq.block_table)
        assert seq.num_computed_tokens <= min(seq.num_tokens, len(seq.block_table) * pool.block_size)
    for seq in scheduler.waiting:
        assert seq.status is SequenceStatus.WAITING and not seq.block_table and seq.num_computed_tokens == 0


def refuse_invalid(engine: Engine, rng: random.Random) -> None:
    """A request that must be refused at add_request: a ValueError that names the problem, and nothing queued."""
    prompt, params, problem = rng.choice([
        ([1] * MAX_MODEL_LEN, SamplingParams(max_tokens=2), "max_model_len"),
        ([1, VOCAB + 5], SamplingParams(max_tokens=2), "token ids"),
        ([1, 5], SamplingParams(stop_token_ids=[VOCAB]), "stop_token_ids"),
        ([], SamplingParams(), "non-empty"),
    ])
    queued, free, ids = len(engine.scheduler.waiting), engine.pool.num_free_blocks, set(engine.requests)
    with pytest.raises(ValueError, match=problem):
        engine.add_request(prompt, params)
    assert (len(engine.scheduler.waiting), engine.pool.num_free_blocks, set(engine.requests)) == (queued, free, ids)


def summary(completion) -> tuple:
    return list(completion.token_ids), completion.text, completion.finish_reason, completion.stop_reason


def drive(engine: Engine, rng: random.Random, workload) -> tuple[dict, dict, dict, set]:
    """Run the workload to the end with random aborts and refused requests, checking the pool after every step.
    Returns the requests (id -> (prompt, params)), the final outputs, every progress snapshot and the aborted ids."""
    workload, requests, finals, aborted = list(workload), {}, {}, set()
    progress = collections.defaultdict(list)  # (request id, index) -> [(token ids, delta, text)]
    for step in range(2000):
        if not workload and not engine.has_unfinished_requests():
            break
        while workload and workload[0][0] <= step:
            _, prompt, params = workload.pop(0)
            requests[engine.add_request(prompt, params)] = (prompt, params)
        if engine.requests and rng.random() < 0.06:
            victim = rng.choice(sorted(engine.requests))
            engine.abort(victim)
            aborted.add(victim)
        if rng.random() < 0.05:
            refuse_invalid(engine, rng)
        for out in engine.step():
            for c in out.outputs:
                assert PENDING not in list(c.token_ids) and (c.logprobs is None or len(c.logprobs) == len(c.token_ids))
                progress[out.request_id, c.index].append((list(c.token_ids), c.delta_text, c.text))
            if out.finished:
                assert out.request_id not in finals
                finals[out.request_id] = [summary(c) for c in out.outputs]
        check_pool(engine)
    assert not engine.has_unfinished_requests() and not engine.requests
    assert engine.pool.num_free_blocks == engine.pool.num_blocks and sum(engine.pool.ref_counts) == 0
    return requests, finals, progress, aborted


def unstopped_oracle(plain: Engine, prompt: list[int], params: SamplingParams) -> tuple:
    """What a greedy request that ignores EOS must return, from the tokens it gives without stops: it ends at the
    first stop id, or at the first stop string that ends in the text of a token past min_tokens (vLLM's rules)."""
    free = dataclasses.replace(params, stop=None, stop_token_ids=None, min_tokens=0, logprobs=None)
    tokens = list(plain.generate([prompt], free)[0].outputs[0].token_ids)
    detokenizer, text = IncrementalDetokenizer(plain.tokenizer, prompt), ""
    for i, token in enumerate(tokens, 1):
        if i > params.min_tokens and token in params.stop_token_ids:
            return tokens[:i], text, "stop", token
        detokenizer.update([token])
        new = detokenizer.output_text
        matches = [(start + len(s), start, s) for s in params.stop
                   if (start := new.find(s, max(0, len(text) - len(s) + 1))) >= 0]
        if i > params.min_tokens and matches:
            end, start, stop = min(matches)
            return tokens[:i], new[:end if params.include_stop_str_in_output else start], "stop", stop
        text = new
    return tokens, text, "length", None


def check_outputs(plain: Engine, options: dict, requests: dict, finals: dict, progress: dict, aborted: set) -> None:
    """Each request's outputs are those of a plain run of it alone; an aborted one's progress is their start."""
    for snapshots in progress.values():  # progress only grows, and its deltas add up to the text
        assert "".join(delta for _, delta, _ in snapshots) == snapshots[-1][2]
        assert all(later[:len(earlier)] == earlier for (earlier, _, _), (later, _, _) in zip(snapshots, snapshots[1:]))
    for request_id, (prompt, params) in requests.items():
        if "speculative_config" in options and not params.greedy:
            continue  # rejection sampling draws other random numbers than plain sampling: other samples
        expected = [summary(c) for c in plain.generate([prompt], params)[0].outputs]
        if request_id in finals:
            assert finals[request_id] == expected, (request_id, prompt, params)
        else:
            assert request_id in aborted
            for index, (tokens, *_) in enumerate(expected):
                seen = progress.get((request_id, index), [([], "", "")])[-1][0]
                assert tokens[:len(seen)] == seen, (request_id, prompt, params)
        if params.greedy and params.ignore_eos and not (params.min_tokens and params.stop_token_ids):
            assert expected[0] == unstopped_oracle(plain, prompt, params), (prompt, params)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_random_workloads_match_one_request_at_a_time(llama, plain, name):
    options, stats = CONFIGS[name], collections.Counter()
    for seed in (10 * list(CONFIGS).index(name), 10 * list(CONFIGS).index(name) + 1):
        engine = Engine.from_pretrained(llama, max_model_len=MAX_MODEL_LEN, **options)
        bursts = engine.runner.execute_decode_steps  # counted, to show the config did what it is here for
        engine.runner.execute_decode_steps = lambda batch, n: stats.update(["bursts"]) or bursts(batch, n)
        rng = random.Random(seed)
        requests, finals, progress, aborted = drive(engine, rng, random_workload(rng))
        check_outputs(plain, options, requests, finals, progress, aborted)
        stats.update(aborted=len(aborted), preemptions=engine.scheduler.num_preemptions,
                     hits=engine.pool.prefix_cache_hits,
                     drafts=engine.spec_decoder.stats.num_drafts if engine.spec_decoder else 0)
    assert stats["aborted"]
    assert bool(stats["hits"]) == engine.config.enable_prefix_caching
    assert bool(stats["preemptions"]) >= name.startswith("preemption")
    assert bool(stats["bursts"]) == (engine.config.num_decode_steps > 1)
    assert bool(stats["drafts"]) == (engine.config.speculative_config is not None)


def test_aborting_a_request_that_shares_a_cached_prefix(llama, plain):
    """A's blocks hold the shared prefix; B takes them from the cache and is aborted mid-prefill, then A is aborted
    while C holds the same blocks: the survivors' tokens are those of a plain run, and every block comes back."""
    engine = Engine.from_pretrained(llama, max_model_len=MAX_MODEL_LEN, block_size=4, max_num_batched_tokens=6)
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    prefix = SHARED[2]  # 21 tokens: 5 full blocks
    a = engine.add_request(prefix + [5], params)
    while len(engine.requests[a].seqs[0].output_token_ids) < 2:
        engine.step()
    b = engine.add_request(prefix + list(range(60, 80)), params)
    engine.step()
    engine.step()
    seq_b = engine.requests[b].seqs[0]
    assert seq_b.num_cached_tokens == 20 and seq_b.num_computed_tokens < seq_b.num_tokens  # hit; still in prefill
    shared = seq_b.block_table[:5]
    assert all(engine.pool.ref_counts[block] == 2 for block in shared)
    engine.abort(b)
    c = engine.add_request(prefix + [7], params)
    engine.step()
    engine.step()
    assert engine.requests[c].seqs[0].block_table[:5] == shared == engine.requests[a].seqs[0].block_table[:5]
    engine.abort(a)
    check_pool(engine)
    finals = {}
    while engine.has_unfinished_requests():
        finals.update((out.request_id, out) for out in engine.step() if out.finished)
        check_pool(engine)
    assert list(finals) == [c] and finals[c].num_cached_tokens == 20
    assert finals[c].outputs[0].token_ids == plain.generate([prefix + [7]], params)[0].outputs[0].token_ids
    assert engine.pool.num_free_blocks == engine.pool.num_blocks and sum(engine.pool.ref_counts) == 0
