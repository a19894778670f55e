"""Continuous batching with chunked prefill and preemption by recompute, first come first served.

Every step is one flat batch in which each scheduled sequence contributes some new tokens:
1 for a decoding sequence, up to the remaining token budget for one still in prefill. Running
sequences are served first, oldest first; when the block pool runs dry the newest running
sequence is preempted (its blocks freed, its tokens recomputed later) and goes back to the
front of the waiting queue. Waiting sequences are admitted only when nobody was preempted; with
prefix caching a waiting sequence first takes the cached blocks of its longest cached prefix
(kv_cache.BlockPool), and only the rest of its tokens count against the step's budget. Sequences
whose prompts are mostly being computed by another (the n sequences of one request, a prompt sent
again, a long shared system prompt) wait in the queue until its blocks are cached, while the
sequences behind them are admitted, and then take them.

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
        scheduled, in_flight, i = [], self._blocks_in_flight(), 0
        while i < len(self.waiting) and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[i]
            hits = self.pool.cached_prefix(seq)
            if self._waits_for_prompt(seq, hits, in_flight):  # its prompt's blocks are being computed: cached soon
                i += 1
                continue
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
            in_flight.update(self._uncached_prompt_keys(seq))
        return scheduled

    def _blocks_in_flight(self) -> set[bytes]:
        """Prefix-cache keys of the prompt blocks that running sequences compute and have not cached yet."""
        keys: set[bytes] = set()
        for seq in self.running:
            keys.update(self._uncached_prompt_keys(seq))
        return keys

    def _uncached_prompt_keys(self, seq: Sequence) -> list[bytes]:
        if not self.pool.enable_prefix_caching:
            return []
        return seq.block_keys[seq.num_registered_blocks:(seq.num_prompt_tokens - 1) // self.pool.block_size]

    def _waits_for_prompt(self, seq: Sequence, hits: list[int], in_flight: set[bytes]) -> bool:
        """Whether a waiting sequence should let a running one finish computing the prompt they share: when at least
        half of its prompt's blocks past its cache hits are being computed by another sequence (the n sequences of
        one request, the same prompt sent again, a long shared system prompt). The steps register those blocks as
        they are computed and it then takes them, instead of prefilling them side by side (twice the compute and
        the blocks). Its first token comes a step after the other's; sequences behind it are admitted meanwhile."""
        if not in_flight or seq.num_computed_tokens:
            return False
        keys = seq.block_keys[len(hits):(seq.num_prompt_tokens - 1) // self.pool.block_size]
        shared = next((j for j, key in enumerate(keys) if key not in in_flight), len(keys))
        return shared > 0 and 2 * shared >= len(keys)

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
