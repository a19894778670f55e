"""Continuous batching with chunked prefill and preemption by recompute, first come first served.

Every step is one flat batch in which each scheduled sequence contributes some new tokens:
1 for a decoding sequence, up to the remaining token budget for one still in prefill. Running
sequences are served first, oldest first; when the block pool runs dry the newest running
sequence is preempted (its blocks freed, its tokens recomputed later) and goes back to the
front of the waiting queue. Waiting sequences are admitted only when nobody was preempted; with
prefix caching a waiting sequence first takes the cached blocks of its longest cached prefix
(kv_cache.BlockPool), and only the rest of its tokens count against the step's budget. The n
sequences of one request (n > 1) share their prompt the same way: one computes it, the others wait
in the queue until its full blocks are cached, while the requests behind them are admitted.

Speculative decoding: a running sequence may carry proposed tokens (seq.spec_token_ids) to verify
after its last one. They are granted last, from what the step has left once running and waiting
sequences are served: token budget, free blocks (they never preempt anyone) and, for a compiled step,
logits rows (max_num_logits: its sampled-rows dimension is bounded, by its token budget since verify
steps sample every token; an older artifact's by its max_num_seqs); the rest of the proposals are dropped.
"""

from collections import deque
from typing import NamedTuple

from graphllm.runtime.kv_cache import BlockPool
from graphllm.runtime.sequence import Sequence, SequenceStatus


class ScheduledSeq(NamedTuple):
    seq: Sequence
    num_new_tokens: int

    @property
    def samples(self) -> bool:
        """True when this step computes the sequence's last known token, so a new one is sampled."""
        return self.seq.num_computed_tokens + self.num_new_tokens == self.seq.num_tokens


class Scheduler:
    def __init__(self, pool: BlockPool, max_num_seqs: int, max_num_batched_tokens: int,
                 max_num_logits: int | None = None):
        self.pool = pool
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.max_num_logits = max_num_logits  # logits rows a step may return; None: no limit
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> list[ScheduledSeq]:
        scheduled, preempted = self._schedule_running(self.max_num_batched_tokens)
        if not preempted:
            scheduled += self._schedule_waiting(self._budget_left(scheduled))
        self._grant_spec_tokens(scheduled, self._budget_left(scheduled))
        return scheduled

    def _budget_left(self, scheduled: list[ScheduledSeq]) -> int:
        return self.max_num_batched_tokens - sum(s.num_new_tokens for s in scheduled)

    def _grant_spec_tokens(self, scheduled: list[ScheduledSeq], budget: int) -> None:
        """Keep, in batch order, the proposals that fit the step's leftover tokens, rows and blocks."""
        rows = budget if self.max_num_logits is None else self.max_num_logits - sum(s.samples for s in scheduled)
        for s in scheduled:
            spec = s.seq.spec_token_ids
            if not spec:
                continue
            n = max(0, min(len(spec), budget, rows)) if s.samples else 0
            while n and not self.pool.can_allocate(s.seq, s.num_new_tokens + n):
                n -= 1
            del spec[n:]
            if n:
                self.pool.allocate(s.seq, s.num_new_tokens + n)
                budget, rows = budget - n, rows - n

    def _schedule_running(self, budget: int) -> tuple[list[ScheduledSeq], bool]:
        scheduled, preempted, i = [], False, 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            self.pool.register_full_blocks(seq)  # what the steps before computed: cached for others from now
            if seq.stopping:  # its last token is still on the device: nothing more to compute
                i += 1
                continue
            num_new = min(seq.num_uncomputed_tokens, budget)
            while not self.pool.can_allocate(seq, num_new):
                preempted = True
                victim = self.running[-1]
                self.preempt(victim)
                if victim is seq:
                    break
            else:
                self.pool.allocate(seq, num_new)
                scheduled.append(ScheduledSeq(seq, num_new))
                budget -= num_new
                i += 1
        return scheduled, preempted

    def _schedule_waiting(self, budget: int) -> list[ScheduledSeq]:
        scheduled, prefilling, i = [], self._prompts_in_prefill(), 0
        while i < len(self.waiting) and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[i]
            if seq.request_id in prefilling:  # a sibling computes the prompt: its blocks are cached for this one
                i += 1
                continue
            hits = self.pool.cached_prefix(seq)
            num_new = min(seq.num_uncomputed_tokens - len(hits) * self.pool.block_size, budget)
            if not self.pool.can_allocate(seq, num_new, hits):
                break
            del self.waiting[i]
            self.pool.record_lookup(seq, hits)
            self.pool.allocate(seq, num_new, hits)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            scheduled.append(ScheduledSeq(seq, num_new))
            budget -= num_new
            if self._computes_shared_prompt(seq):
                prefilling.add(seq.request_id)
        return scheduled

    def _prompts_in_prefill(self) -> set[str]:
        """Requests (n > 1) one of whose running sequences still computes the prompt's full blocks. With prefix
        caching their waiting siblings wait until it has: the steps register those blocks as they are computed,
        and the siblings then take them from the cache and compute only the prompt's last partial block, instead
        of every sibling prefilling the whole prompt side by side (n times the prompt's compute and blocks). The
        siblings' first tokens come a step after the first's; requests behind them are admitted meanwhile."""
        return {seq.request_id for seq in self.running if self._computes_shared_prompt(seq)}

    def _computes_shared_prompt(self, seq: Sequence) -> bool:
        """Whether seq's request has siblings and seq has prompt blocks a sibling could take but not yet cached."""
        return (seq.params.n > 1 and self.pool.enable_prefix_caching
                and seq.num_registered_blocks < (seq.num_prompt_tokens - 1) // self.pool.block_size)

    def preempt(self, seq: Sequence) -> None:
        """Free seq's blocks and queue it first in line; its tokens will be recomputed."""
        if self.running[-1] is seq:  # the usual victim, the newest: no scan of the running list
            self.running.pop()
        else:
            self.running.remove(seq)
        self.pool.free(seq)
        seq.spec_token_ids.clear()
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def finish(self, seq: Sequence, reason: str) -> None:
        """Take seq out of the queues, free its blocks and mark it finished."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        self.pool.free(seq)
        seq.discard_pending()
        seq.spec_token_ids.clear()
        seq.status, seq.finish_reason = SequenceStatus.FINISHED, reason
