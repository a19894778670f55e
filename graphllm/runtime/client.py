"""EngineClient: the one interface a front end (the HTTP server) has to an engine.

A front end streams requests, aborts them, tokenizes with the engine's tokenizer and reads the
engine's limits and load; the scheduler, the KV pool and the runtime state stay behind it.
`Engine` implements it; a test double only has to implement these members.
"""

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, NamedTuple, Protocol, runtime_checkable

from graphllm.runtime.outputs import RequestOutput
from graphllm.runtime.sampling_params import SamplingParams
from graphllm.runtime.spec_decode.stats import SpecDecodeStats
from graphllm.runtime.structured_output import StructuredOutputsParams

Prompt = str | list[int]


class EngineDeadError(RuntimeError):
    """The engine's step loop failed: the request in hand cannot finish, and no new one is taken."""


class EngineLimits(NamedTuple):
    """What a request must fit; fixed once the engine is built."""

    max_model_len: int  # prompt + output tokens of one sequence
    vocab_size: int  # token ids lie in [0, vocab_size)
    max_num_seqs: int  # sequences in one batch


class EngineStats(NamedTuple):
    """The engine's load at one moment (metrics read it when scraped)."""

    num_requests_running: int  # requests with a sequence in the running batch
    num_requests_waiting: int  # requests with a sequence waiting to be scheduled
    num_free_blocks: int  # KV-cache blocks free in the pool
    num_blocks: int  # KV-cache blocks the pool holds
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache, since start
    prefix_cache_hits: int = 0  # of those, tokens found cached
    spec_decode: SpecDecodeStats | None = None  # speculative decoding's counters, since start (None: not speculating)


@runtime_checkable
class EngineClient(Protocol):
    @property
    def tokenizer(self) -> Any:
        """The model's Hugging Face tokenizer, or None when the model folder has none."""

    @property
    def limits(self) -> EngineLimits:
        """Context length, vocabulary size and batch size the engine was built with."""

    @property
    def model_path(self) -> Path:
        """The model folder or compiled artifact served (its generation_config.json holds defaults)."""

    def stream(self, prompt: Prompt, params: SamplingParams | None = None,
               request_id: str | None = None) -> AsyncIterator[RequestOutput]:
        """Yield a RequestOutput each step the request advances; the last one has finished=True.

        Closing the iterator early aborts the request. A prompt the engine refuses (too long,
        token ids out of range, a request id in use) raises ValueError.
        """

    def abort(self, request_id: str) -> None:
        """Stop a request now and free its KV blocks; unknown or finished ids are ignored."""

    def stats(self) -> EngineStats:
        """Running and waiting requests and free KV blocks now; safe to call while a step runs."""

    def check_health(self) -> None:
        """Raise EngineDeadError once a step has failed (the step loop stopped); return otherwise."""

    def check_structured_outputs(self, params: StructuredOutputsParams) -> None:
        """Compile a request's grammar (cached for when the request comes); ValueError if it does not compile."""

    def reset_prefix_cache(self) -> int:
        """Forget every cached prefix (blocks in use keep their contents); the number of blocks forgotten."""
