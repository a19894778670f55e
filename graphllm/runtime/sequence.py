"""One generated stream: its tokens, progress through the KV cache, and why it finished."""

import enum
from dataclasses import dataclass, field
from typing import Any

import torch

from graphllm.runtime.sampling_params import SamplingParams


PENDING = -1  # token_ids entry of a token sampled on the device and not read back yet (async scheduling)


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """A request with n > 1 has n sequences (index 0..n-1) sharing one request id.

    token_ids holds prompt + output; num_computed_tokens of them have their K/V in the cache.
    prompt_token_ids and output_token_ids are its two parts kept as lists of their own, so that
    reading them costs no copy; append_token is the one way to add a token (to both lists).
    token_ids, output_token_ids and logprobs only grow: outputs hand out O(1) snapshots of them.

    Under async scheduling the newest token may be PENDING: sampled on the device by a step still
    in flight (row `pending_row` of that step's tokens), so that the next step can be scheduled and
    launched before it is read back; `resolve` writes it in. `stopping`: that pending token is the
    sequence's last (max_tokens or max_model_len), so it is not scheduled again.
    """

    seq_id: int
    request_id: str
    index: int
    token_ids: list[int]
    num_prompt_tokens: int
    params: SamplingParams
    generator: torch.Generator | None = None
    detokenizer: Any = None  # IncrementalDetokenizer, or None without a tokenizer
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    logprobs: list[dict] | None = None
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it
    num_preemptions: int = 0
    pending_row: int | None = None  # set while token_ids[-1] is PENDING
    stopping: bool = False
    block_keys: list[bytes] = field(default_factory=list)  # prefix-cache keys of its full blocks (kv_cache)
    num_registered_blocks: int = 0  # of its block table, the leading blocks it registered or took from the cache
    num_cached_tokens: int | None = None  # prompt tokens its first admission found in the prefix cache
    grammar: Any = None  # its xgrammar GrammarMatcher under structured output (runtime/structured_output.py)
    grammar_open: bool = False  # past its reasoning (structured_output.grammar_live)
    # speculative decoding: tokens proposed after token_ids, verified by the next step (never in token_ids;
    # the scheduler trims them to its budgets, runtime/spec_decode/decoder.py sets and clears them)
    spec_token_ids: list[int] = field(default_factory=list)
    prompt_token_ids: list[int] = field(init=False)  # token_ids[:num_prompt_tokens]
    output_token_ids: list[int] = field(init=False)  # token_ids[num_prompt_tokens:]

    def __post_init__(self) -> None:
        self.prompt_token_ids = self.token_ids[:self.num_prompt_tokens]
        self.output_token_ids = self.token_ids[self.num_prompt_tokens:]

    def append_token(self, token: int) -> None:
        self.token_ids.append(token)
        self.output_token_ids.append(token)

    def append_pending(self, row: int) -> None:
        self.append_token(PENDING)
        self.pending_row = row

    def resolve(self, token: int) -> None:
        """The pending token, read back from the device."""
        assert self.pending_row is not None, "no pending token"
        self.token_ids[-1] = self.output_token_ids[-1] = token
        self.pending_row = None

    def discard_pending(self) -> None:
        """Drop a pending token that will not be read (the sequence finished or was aborted meanwhile)."""
        if self.pending_row is not None:
            self.token_ids.pop()
            self.output_token_ids.pop()
            self.pending_row = None

    @property
    def num_resolved_output_tokens(self) -> int:
        """Output tokens known on the host (what outputs report)."""
        return self.num_output_tokens - (self.pending_row is not None)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED
