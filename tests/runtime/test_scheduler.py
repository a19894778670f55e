from graphllm.runtime.kv_cache import BlockPool
from graphllm.runtime.sampling_params import SamplingParams
from graphllm.runtime.scheduler import Scheduler
from graphllm.runtime.sequence import Sequence, SequenceStatus


def make_seq(seq_id, num_tokens):
    return Sequence(seq_id, f"r{seq_id}", 0, list(range(num_tokens)), num_tokens, SamplingParams())


def run_step(batch):
    """What the engine does after the model ran: advance, and append a token where sampled."""
    for seq, n in batch:
        sampled = seq.num_computed_tokens + n == seq.num_tokens
        seq.num_computed_tokens += n
        if sampled:
            seq.append_token(0)


def test_chunked_prefill_respects_token_budget():
    sched = Scheduler(BlockPool(100, 4), max_num_seqs=8, max_num_batched_tokens=6)
    a, b = make_seq(0, 10), make_seq(1, 3)
    sched.add(a), sched.add(b)
    assert [(s.seq.seq_id, s.num_new_tokens, s.samples) for s in sched.schedule()] == [(0, 6, False)]
    run_step([(a, 6)])
    batch = sched.schedule()
    assert [(s.seq.seq_id, s.num_new_tokens, s.samples) for s in batch] == [(0, 4, True), (1, 2, False)]
    run_step(batch)
    batch = sched.schedule()  # a decodes, b finishes its prefill
    assert [(s.seq.seq_id, s.num_new_tokens) for s in batch] == [(0, 1), (1, 1)]


def test_max_num_seqs_limits_admission():
    sched = Scheduler(BlockPool(100, 4), max_num_seqs=2, max_num_batched_tokens=100)
    for i in range(3):
        sched.add(make_seq(i, 4))
    assert [s.seq.seq_id for s in sched.schedule()] == [0, 1]
    assert len(sched.waiting) == 1


def test_preempts_newest_and_requeues_it_first():
    pool = BlockPool(3, 4)
    sched = Scheduler(pool, max_num_seqs=8, max_num_batched_tokens=100)
    a, b = make_seq(0, 4), make_seq(1, 4)
    sched.add(a), sched.add(b)
    batch = sched.schedule()
    run_step(batch)  # both hold one full block; a's next token needs a second block
    c = make_seq(2, 4)
    sched.add(c)
    batch = sched.schedule()  # a takes block 3, b needs one more -> none left -> b preempted
    assert [(s.seq.seq_id, s.num_new_tokens) for s in batch] == [(0, 1)]
    assert b.status is SequenceStatus.WAITING and b.num_computed_tokens == 0 and b.block_table == []
    assert list(sched.waiting) == [b, c] and sched.num_preemptions == 1
    run_step(batch)
    sched.finish(a, "stop")
    batch = sched.schedule()  # b comes back first and recomputes prompt + its output token
    assert [(s.seq.seq_id, s.num_new_tokens) for s in batch][0] == (1, 5)
    assert pool.num_free_blocks + sum(len(s.block_table) for s in (b, c)) == 3


def test_finish_frees_blocks():
    pool = BlockPool(10, 4)
    sched = Scheduler(pool, 8, 100)
    seq = make_seq(0, 6)
    sched.add(seq)
    sched.schedule()
    sched.finish(seq, "abort")
    assert pool.num_free_blocks == 10 and not sched.has_unfinished() and seq.finish_reason == "abort"
