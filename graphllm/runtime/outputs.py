"""What the engine hands back: one RequestOutput per request, one CompletionOutput per sequence."""

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import islice

from graphllm.runtime.sampler import Logprob


class ListSnapshot(Sequence):
    """The first n items of an append-only list, as they stood when the snapshot was taken.

    Taking one is O(1) whatever the list's length, and it never changes afterwards (the list
    only grows past n). It reads like a list: len, indexing, slicing (a new list of just those
    items), iteration, and == against lists and other snapshots.
    """

    __slots__ = ("_items", "_len")

    def __init__(self, items: list, n: int | None = None):
        self._items, self._len = items, len(items) if n is None else n

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, i):
        span = range(self._len)[i]  # resolves negative indices and slice bounds; IndexError past n
        if isinstance(span, int):
            return self._items[span]
        if span.step == 1:
            return self._items[span.start:span.stop]
        return [self._items[j] for j in span]

    def __iter__(self) -> Iterator:
        return islice(self._items, self._len)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (list, ListSnapshot)):
            return len(self) == len(other) and list(self) == list(other)
        return NotImplemented

    __hash__ = None  # like a list

    def __add__(self, other: list) -> list:
        return list(self) + other if isinstance(other, list) else NotImplemented

    def __radd__(self, other: list) -> list:
        return other + list(self) if isinstance(other, list) else NotImplemented

    def __repr__(self) -> str:
        return repr(list(self))


@dataclass
class CompletionOutput:
    """token_ids and logprobs are lists once the request finished; before, ListSnapshots
    (read-only, frozen at this step's length) so that a step costs no copy of them."""

    index: int  # 0..n-1 within the request
    text: str  # text so far (while streaming, minus a held-back tail that might start a stop string)
    token_ids: Sequence[int]
    logprobs: Sequence[dict[int, Logprob]] | None  # per output token: sampled + top-N alternatives
    finish_reason: str | None  # None while running; "stop" | "length" | "abort"
    stop_reason: int | str | None = None  # the stop token id or stop string, if one ended it
    delta_text: str = ""  # text new since the previous RequestOutput of this request

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache (the first sequence's admission)
