"""The step loop: schedule a batch, run the model on it, hand the results to post-processing.

One call of `step` is one engine step, in one of three forms:
- synchronous: schedule, run, sample on the host, report;
- multi-step decode (config.num_decode_steps > 1): a plain-greedy decode batch runs several
  steps back to back, each step's argmax fed to the next on the device, read back once;
- async scheduling (config.async_scheduling): launch step N + 1 before reading back step N, so
  that the host's work for one step overlaps the device's work for the other.
Speculative decoding (config.speculative_config) runs synchronously: proposals are made before a
step from the tokens read back after the one before, and verified after it (spec_decode/decoder.py).
"""

import logging
import threading
import time
from typing import NamedTuple

import torch

from graphllm.config import EngineConfig
from graphllm.runtime.kv_cache import BlockPool
from graphllm.runtime.model_runner import ModelRunner
from graphllm.runtime.outputs import RequestOutput
from graphllm.runtime.postprocess import PostProcessor
from graphllm.runtime.sampler import plain_greedy
from graphllm.runtime.scheduler import ScheduledSeq, Scheduler
from graphllm.runtime.sequence import Sequence
from graphllm.runtime.setup import RuntimeState
from graphllm.runtime.spec_decode.decoder import SpeculativeDecoder
from graphllm.runtime.stopping import reached_length

logger = logging.getLogger(__name__)


class InFlight(NamedTuple):
    """A launched step whose sampled tokens are not read back yet (async scheduling)."""

    seqs: list[Sequence]  # row i of tokens is seqs[i]'s PENDING token
    tokens: torch.Tensor  # [R] on the device: the next step's inputs are copied from here
    host: tuple[torch.Tensor, torch.cuda.Event | None]  # their copy on the host, and when it is done


class StepLoop:
    def __init__(self, config: EngineConfig, scheduler: Scheduler, pool: BlockPool, runner: ModelRunner,
                 state: RuntimeState, post: PostProcessor, spec: SpeculativeDecoder | None = None):
        self.scheduler, self.pool, self.runner, self.state, self.post = scheduler, pool, runner, state, post
        self.num_decode_steps = config.num_decode_steps
        self.spec = spec
        # async scheduling needs a backend whose per-step planning cannot disturb the step in flight,
        # and gives way to queued decode steps (num_decode_steps > 1), which overlap the host their own way,
        # and to speculative decoding (its proposals need the tokens read back)
        self.async_scheduling: bool = (config.async_scheduling and config.num_decode_steps == 1
                                       and not runner.backend.plans_on_host and spec is None)
        if config.async_scheduling and spec is not None:
            logger.info("speculative decoding runs its steps synchronously (async scheduling off): each step's "
                        "proposals need the tokens read back after the step before")
        self._in_flight: InFlight | None = None  # the step whose tokens are still on the device
        # held by a step and by whoever adds or aborts requests: steps may run in a worker thread
        self.lock = threading.Lock()

    def step(self) -> list[RequestOutput]:
        """Schedule, run the model once, sample, and report every request that advanced.

        Under async scheduling (`_step_async`) the tokens a call reports are those of the step
        before: each call launches one step and reads back the previous one.
        """
        with self.lock:
            return self._step()

    def _step(self) -> list[RequestOutput]:
        if self.async_scheduling:
            return self._step_async()
        if self.spec is not None:
            self.spec.propose(self.scheduler.running)
        batch = self.scheduler.schedule()
        if not batch:
            return []
        num_steps = self._decode_steps(batch)
        if num_steps > 1:
            self._run_decode_steps(batch, num_steps)
        else:
            start = time.perf_counter()
            logits = self.runner.execute(batch)  # [N, V]: 1 + k rows for a sequence with k proposals
            sampling = [s.seq for s in batch if s.samples]
            for seq, num_new in batch:
                seq.num_computed_tokens += num_new
            if self.spec is not None and any(seq.spec_token_ids for seq in sampling):
                self.spec.verify(logits, sampling, since=start)
            elif sampling:
                self.post.constrain(logits, sampling)
                self.post.sample(logits, sampling)
        return self.post.report({s.seq.request_id for s in batch})

    # -- async scheduling -------------------------------------------------------------------

    def _step_async(self) -> list[RequestOutput]:
        """Launch step N + 1, then read back step N: the host's work for one step overlaps the GPU's
        work for the other (what vLLM calls async scheduling, SGLang its overlap scheduler).

        1. Schedule N + 1 while N's tokens are still on the device. Each sequence N samples holds
           a PENDING token; as an input of N + 1 it is copied on the device from N's tokens.
        2. Launch N + 1 (inputs, graph replay): queued behind N, not waited for.
        3. Read back N's tokens (N has finished or nearly), append them, check stops, detokenize.
           A sequence that stopped at N wastes its row of N + 1; its blocks are freed now, and the
           stream order keeps N + 1's writes to them before any later step's.
        4. Sample N + 1 on the device and keep its tokens in flight. Rows that need host lists
           (logprobs, penalties) are sampled now instead, which waits for N + 1.
        A sequence whose pending token is its last by length is not scheduled again (`stopping`).
        """
        batch = self.scheduler.schedule()
        previous, self._in_flight = self._in_flight, None
        logits, sampling = None, []
        if batch:
            sampling = [s.seq for s in batch if s.samples]
            logits = self.runner.execute(batch, previous.tokens if previous else None)
            for seq, num_new in batch:
                seq.num_computed_tokens += num_new
        advanced = self._read_back(previous) if previous else []
        live = [i for i, seq in enumerate(sampling) if not seq.is_finished]
        if live:
            # Rows of sequences that finished at N are sampled too, and dropped: selecting the
            # others on the device would wait for N + 1 (an index built on the host). Grammars mask
            # now, with N's tokens read back and accepted.
            self.post.constrain(logits, sampling)
            tokens = self.post.sample_on_device(logits, sampling)
            if tokens is None:
                if len(live) < len(sampling):
                    logits, sampling = logits[live], [sampling[i] for i in live]
                self.post.sample(logits, sampling)
                advanced += sampling
            else:
                self._keep_in_flight(sampling, tokens)
        return self.post.report({seq.request_id for seq in advanced})

    def _keep_in_flight(self, seqs: list[Sequence], tokens: torch.Tensor) -> None:
        """Keep tokens [R] in flight: each live sequence holds a PENDING token for its row."""
        self._in_flight = InFlight(seqs, tokens, self._to_host(tokens))
        for row, seq in enumerate(seqs):
            if seq.is_finished:
                continue
            seq.append_pending(row)
            seq.stopping = reached_length(seq, self.state.max_model_len)

    def _to_host(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event | None]:
        """A copy of tokens on the host, queued now, and the event that marks it done (None on CPU)."""
        if not tokens.is_cuda:
            return tokens, None
        host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
        host.copy_(tokens, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        return host, done

    def _wait_for_tokens(self, step: InFlight) -> list[int]:
        host, done = step.host
        if done is not None:
            done.synchronize()
        return host.tolist()

    def _read_back(self, step: InFlight) -> list[Sequence]:
        """Wait for an in-flight step's tokens and give each to its sequence (unless it finished meanwhile)."""
        advanced, update_stop = [], self.post.update_stop
        for seq, token in zip(step.seqs, self._wait_for_tokens(step)):
            if seq.pending_row is None:  # finished or aborted since: the token is dropped
                continue
            seq.resolve(token)
            update_stop(seq, token)
            advanced.append(seq)
        return advanced

    # -- multi-step decode ------------------------------------------------------------------

    def _decode_steps(self, batch: list[ScheduledSeq]) -> int:
        """How many decode steps this batch may run back to back (config.num_decode_steps at most).

        Only a batch of decoding sequences that are all plain greedy (argmax, no logprobs,
        penalties, grammar or pending min_tokens) qualifies: their next inputs are the previous argmax,
        known on the device. No sequence is stepped past its max_tokens or max_model_len, and the
        KV blocks for every step must be free now. A sequence that stops on the way (EOS, stop
        token or string) wastes the remaining steps' compute; their tokens are dropped.
        """
        steps = self.num_decode_steps
        if steps == 1 or self.runner.backend.plans_on_host or not all(s.num_new_tokens == 1 and s.samples
                                                                        for s in batch):
            return 1  # a backend that plans per step (FlashInfer) cannot have steps queued
        limit = self.state.max_model_len
        for s in batch:
            seq, params = s.seq, s.seq.params
            if (not plain_greedy(params) or params.structured_outputs is not None
                    or self.post.min_tokens_stop_ids(seq)):
                return 1
            steps = min(steps, limit - seq.num_tokens)
            if params.max_tokens is not None:
                steps = min(steps, params.max_tokens - seq.num_output_tokens)
        if steps > 1 and sum(self.pool.blocks_needed(s.seq, steps) for s in batch) > self.pool.num_free_blocks:
            return 1
        return max(steps, 1)

    def _run_decode_steps(self, batch: list[ScheduledSeq], num_steps: int) -> None:
        for s in batch:
            self.pool.allocate(s.seq, num_steps)
        tokens = self.runner.execute_decode_steps(batch, num_steps)  # [num_steps][B]
        seqs, update_stop = [s.seq for s in batch], self.post.update_stop
        for row in tokens:
            for seq, token in zip(seqs, row):
                if not seq.is_finished:
                    seq.num_computed_tokens += 1
                    seq.append_token(token)
                    update_stop(seq, token)
