"""Automatic prefix caching (EngineConfig.enable_prefix_caching, graphllm/runtime/kv_cache.py).

The pool's bookkeeping first (keys, hits, the last-token rule, LRU eviction, reset, no leaks), then
engines with caching on and off running the same requests: it may change how many tokens are computed,
never which tokens come out, under chunked prefill, preemption, n > 1, seeded sampling, async scheduling
on and off, and an fp8 KV cache."""

import pytest
import torch

from graphllm import Engine, SamplingParams
from graphllm.runtime.kv_cache import BlockPool, block_key
from graphllm.runtime.sampling_params import SamplingParams as Params
from graphllm.runtime.scheduler import Scheduler
from graphllm.runtime.sequence import PENDING, Sequence

BS = 4
# on a GPU the triton kernels and the torch reference (FlashInfer has no kernels for the tiny head_dim 16)
BACKENDS = ("triton", "torch") if torch.cuda.is_available() else ("auto",)


def make_seq(seq_id: int, tokens: list[int]) -> Sequence:
    return Sequence(seq_id, f"r{seq_id}", 0, list(tokens), len(tokens), Params())


def compute_all(pool: BlockPool, seq: Sequence) -> None:
    """Allocate and 'compute' every token of seq (what a step does), then register its full blocks."""
    pool.allocate(seq, seq.num_uncomputed_tokens)
    seq.num_computed_tokens = seq.num_tokens
    pool.register_full_blocks(seq)


# -- the pool ----------------------------------------------------------------------------------------

def test_keys_chain_over_the_whole_prefix():
    a, b = block_key(b"", [1, 2, 3, 4]), block_key(b"", [1, 2, 3, 5])
    assert len(a) == 16 and a != b  # 128-bit
    assert block_key(a, [9, 9, 9, 9]) != block_key(b, [9, 9, 9, 9])  # same tokens, other parent: other key
    assert block_key(a, [9, 9, 9, 9]) == block_key(block_key(b"", [1, 2, 3, 4]), [9, 9, 9, 9])


def test_a_second_sequence_takes_the_cached_prefix_but_computes_its_last_token():
    pool = BlockPool(16, BS, enable_prefix_caching=True)
    first = make_seq(0, list(range(10)))  # blocks [0..3] [4..7] full, [8, 9] partial
    assert pool.cached_prefix(first) == []
    compute_all(pool, first)
    assert pool.num_cached_blocks == 2
    same = make_seq(1, list(range(10)))
    hits = pool.cached_prefix(same)
    assert hits == first.block_table[:2]
    longer = make_seq(2, list(range(12)))  # its third block [8..11] was never full in `first`
    assert pool.cached_prefix(longer) == first.block_table[:2]
    exact = make_seq(3, list(range(8)))  # the whole prompt is cached: the last block is computed again
    assert pool.cached_prefix(exact) == first.block_table[:1]
    other = make_seq(4, [7] + list(range(1, 10)))  # differs in the first token: nothing
    assert pool.cached_prefix(other) == []

    free_before = pool.num_free_blocks
    assert pool.can_allocate(same, 2, hits)
    pool.record_lookup(same, hits)
    pool.allocate(same, 2, hits)
    assert same.num_computed_tokens == 8 and same.block_table[:2] == hits and len(same.block_table) == 3
    assert [pool.ref_counts[b] for b in hits] == [2, 2]
    assert pool.num_free_blocks == free_before - 1  # only the new third block came off the free queue
    assert (same.num_cached_tokens, pool.prefix_cache_queries, pool.prefix_cache_hits) == (8, 10, 8)


def test_freed_blocks_stay_cached_until_evicted_least_recently_freed_first():
    pool = BlockPool(4, BS, enable_prefix_caching=True)
    a, b = make_seq(0, list(range(9))), make_seq(1, list(range(100, 105)))
    compute_all(pool, a)  # 3 blocks, 2 full
    pool.free(a)
    compute_all(pool, b)  # takes the never-used block first, then a's last (partial, uncached) block
    assert pool.num_cached_blocks == 3  # a's two and b's first
    assert pool.cached_prefix(make_seq(2, list(range(9)))) != []
    pool.free(b)
    assert pool.num_free_blocks == 4  # every block back: free and cached
    c = make_seq(3, list(range(200, 212)))  # needs 3 blocks: evicts two cached ones, oldest freed first
    compute_all(pool, c)
    assert pool.cached_prefix(make_seq(4, list(range(9)))) == []  # a's blocks were freed first: gone
    assert pool.cached_prefix(make_seq(5, list(range(100, 105)))) != []  # b's first block survived
    pool.free(c)
    assert pool.num_free_blocks == 4 and sum(pool.ref_counts) == 0


def test_a_hit_in_the_free_queue_is_not_counted_as_free():
    pool = BlockPool(3, BS, enable_prefix_caching=True)
    a = make_seq(0, list(range(9)))
    compute_all(pool, a)
    pool.free(a)  # all 3 blocks free, 2 of them cached
    b = make_seq(1, list(range(8)) + [50, 51, 52, 53, 54])  # hits a's 2 blocks, needs 2 more
    hits = pool.cached_prefix(b)
    assert len(hits) == 2 and pool.num_free_blocks == 3
    assert not pool.can_allocate(b, 5, hits)  # 2 new blocks, but only 1 free once the hits are taken
    assert pool.can_allocate(b, 4, hits)


def test_pending_tokens_are_never_keyed_and_reset_forgets_everything():
    pool = BlockPool(8, BS, enable_prefix_caching=True)
    a = make_seq(0, [1, 2, 3])
    compute_all(pool, a)
    a.append_pending(0)  # the 4th token is still on the device
    a.num_computed_tokens = 4  # async scheduling computes it in the next step before it is read
    pool.register_full_blocks(a)
    assert pool.num_cached_blocks == 0 and a.block_keys == []
    a.resolve(9)
    pool.register_full_blocks(a)
    assert pool.num_cached_blocks == 1 and PENDING not in a.token_ids
    assert pool.reset_prefix_cache() == 1
    assert pool.num_cached_blocks == 0 and pool.cached_prefix(make_seq(1, [1, 2, 3, 9, 5])) == []


def test_caching_off_looks_nothing_up():
    pool = BlockPool(8, BS)
    a = make_seq(0, list(range(9)))
    compute_all(pool, a)
    pool.free(a)
    assert pool.cached_prefix(make_seq(1, list(range(9)))) == [] and pool.num_cached_blocks == 0


def test_the_scheduler_admits_with_hits_and_budgets_only_the_rest():
    pool = BlockPool(32, BS, enable_prefix_caching=True)
    sched = Scheduler(pool, max_num_seqs=8, max_num_batched_tokens=64)
    a = make_seq(0, list(range(13)))
    sched.add(a)
    [(seq, n)] = sched.schedule()
    assert n == 13
    seq.num_computed_tokens += n
    seq.append_token(99)
    b = make_seq(1, list(range(12)) + [77])
    sched.add(b)
    batch = sched.schedule()  # a's 3 full blocks register now; b takes them and computes 1 token
    assert [(s.seq.seq_id, s.num_new_tokens) for s in batch] == [(0, 1), (1, 1)]
    assert b.num_cached_tokens == 12 and b.block_table[:3] == a.block_table[:3]


def test_siblings_of_an_n_request_wait_for_the_first_prompt_then_take_its_blocks():
    """n > 1: every sibling prefilled the whole prompt in the same step (n times its compute and blocks). Now the
    first computes it while the others wait, a request behind them is admitted meanwhile, and the siblings then
    compute only the prompt's last partial block. Without caching, nothing waits."""
    def request(seq_ids, prompt, n):
        return [Sequence(i, f"r{seq_ids[0]}", k, list(prompt), len(prompt), Params(n=n)) for k, i in enumerate(seq_ids)]

    for caching, expected in ((True, ([(0, 14), (4, 3)], [(0, 1), (4, 1), (1, 2), (2, 2), (3, 2)])),
                              (False, ([(0, 14), (1, 14), (2, 14), (3, 14), (4, 3)], None))):
        pool = BlockPool(64, BS, enable_prefix_caching=caching)
        sched = Scheduler(pool, max_num_seqs=8, max_num_batched_tokens=256)
        for seq in request([0, 1, 2, 3], range(14), n=4) + request([4], [7, 8, 9], n=1):
            sched.add(seq)
        first = sched.schedule()
        assert [(s.seq.seq_id, s.num_new_tokens) for s in first] == expected[0]
        if not caching:
            continue
        for s in first:
            s.seq.num_computed_tokens += s.num_new_tokens
            s.seq.append_token(99)
        second = sched.schedule()  # the first sibling's 3 full blocks register; the others take them
        assert [(s.seq.seq_id, s.num_new_tokens) for s in second] == expected[1]
        assert all(sibling.seq.block_table[:3] == first[0].seq.block_table[:3] for sibling in second[2:])
        assert pool.num_free_blocks == 64 - 4 - 1 - 3  # the prompt's 3 full blocks once, 4 partial ones, r4's


def test_a_prompt_mostly_in_flight_waits_for_it_and_one_sharing_little_does_not():
    """Separate requests (n = 1) with the prompt another is computing (a prompt sent again, a long shared system
    prompt) wait for its blocks as siblings do; one sharing under half of its blocks is admitted at once."""
    pool = BlockPool(64, BS, enable_prefix_caching=True)
    sched = Scheduler(pool, max_num_seqs=8, max_num_batched_tokens=256)
    system = list(range(12))  # 3 blocks
    first, again = make_seq(0, system + [50, 51, 52]), make_seq(1, system + [50, 51, 52])
    shared_system = make_seq(2, system + [60, 61, 62, 63, 64])  # blocks 0-2 shared of 4: waits
    little = make_seq(3, list(range(4)) + [70 + i for i in range(12)])  # block 0 shared of 3: does not
    for seq in (first, again, shared_system, little):
        sched.add(seq)
    batch = sched.schedule()
    assert [(s.seq.seq_id, s.num_new_tokens) for s in batch] == [(0, 15), (3, 16)]
    for s in batch:
        s.seq.num_computed_tokens += s.num_new_tokens
        s.seq.append_token(99)
    batch = sched.schedule()
    assert [(s.seq.seq_id, s.num_new_tokens) for s in batch] == [(0, 1), (3, 1), (1, 3), (2, 5)]
    assert again.num_cached_tokens == shared_system.num_cached_tokens == 12


# -- engines: the same tokens with and without caching ------------------------------------------------

SYSTEM = [1] + list(range(30, 70))  # a 41-token shared prefix
PROMPTS = [SYSTEM + [5, 9, 17], SYSTEM + [42, 43], SYSTEM + [60, 61, 62], [1, 7, 8], SYSTEM + [5, 9, 17]]


@pytest.fixture(scope="module")
def llama(tiny_model_dir):
    return tiny_model_dir("llama")[0]


def run(engine: Engine, prompts, params) -> list:
    outs = engine.generate(prompts, params)
    assert not engine.has_unfinished_requests()
    pool = engine.pool
    assert pool.num_free_blocks == pool.num_blocks and sum(pool.ref_counts) == 0  # nothing leaked
    return [(list(c.token_ids), c.finish_reason) for o in outs for c in o.outputs]


def both(path, **options) -> tuple[Engine, Engine]:
    return (Engine.from_pretrained(path, enable_prefix_caching=True, **options),
            Engine.from_pretrained(path, enable_prefix_caching=False, **options))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("options", [
    {},
    {"async_scheduling": False},
    {"max_num_batched_tokens": 16, "block_size": 8},  # chunked prefill over cached and uncached blocks
    {"num_kv_blocks": 12, "block_size": 8, "max_num_seqs": 4, "max_model_len": 64},  # preemption, eviction (14 blocks preempted nobody once prompts in flight were shared)
])
def test_greedy_and_seeded_outputs_do_not_change(llama, options, backend):
    on, off = both(llama, attention_backend=backend, **options)
    for params in (SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True),
                   SamplingParams(max_tokens=12, temperature=0.8, seed=3, n=2, ignore_eos=True)):
        first = run(on, PROMPTS, params)
        assert first == run(off, PROMPTS, params)
        assert run(on, PROMPTS, params) == first  # a second pass, from a warm cache
    assert on.pool.prefix_cache_hits > 0 and off.pool.prefix_cache_queries == 0
    if "num_kv_blocks" in options:
        assert on.scheduler.num_preemptions > 0  # the small pool did preempt


def test_cached_tokens_are_reported_and_reset_clears_them(llama):
    engine = Engine.from_pretrained(llama, block_size=8)
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    [cold] = engine.generate([PROMPTS[0]], params)
    [warm] = engine.generate([PROMPTS[1]], params)
    assert cold.num_cached_tokens == 0 and warm.num_cached_tokens == 40  # 5 full blocks of the shared 41
    assert engine.stats().prefix_cache_hits == 40
    assert engine.reset_prefix_cache() > 0
    [again] = engine.generate([PROMPTS[1]], params)
    assert again.num_cached_tokens == 0 and again.outputs[0].token_ids == warm.outputs[0].token_ids


def test_aborts_leave_no_blocks_held(llama):
    engine = Engine.from_pretrained(llama, block_size=8)
    engine.generate([PROMPTS[0]], SamplingParams(max_tokens=2))
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(prompt, SamplingParams(max_tokens=50, ignore_eos=True), request_id=f"x{i}")
    engine.step()
    engine.step()
    for i in range(len(PROMPTS)):
        engine.abort(f"x{i}")
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.pool.num_free_blocks == engine.pool.num_blocks and sum(engine.pool.ref_counts) == 0


def test_fp8_kv_cache_with_caching(llama):
    on, off = both(llama, kv_cache_dtype="fp8", block_size=8)
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    first = run(on, PROMPTS, params)
    assert first == run(off, PROMPTS, params) == run(on, PROMPTS, params)  # the second pass hits
    assert on.pool.prefix_cache_hits > 0
