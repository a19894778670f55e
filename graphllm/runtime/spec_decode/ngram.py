"""NgramProposer: prompt lookup decoding (vLLM's "ngram" method).

For each sequence, the longest suffix n-gram of its tokens (prompt + output), n from prompt_lookup_max
down to prompt_lookup_min, that also occurs earlier in them; the proposal is the (up to) k tokens that
followed its most recent earlier occurrence. Fewer when that occurrence is near the end, none when no
such n-gram occurs. Proposals are deterministic: the verifier treats them as a point-mass draft.
"""

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from graphllm.runtime.sequence import Sequence


class NgramProposer:
    def __init__(self, prompt_lookup_min: int, prompt_lookup_max: int):
        self.min_n, self.max_n = prompt_lookup_min, prompt_lookup_max
        self.max_model_len: int | None = None  # no limit of its own (the draft model has one)

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[list[int]]:
        """Up to ks[i] tokens for seqs[i]."""
        return [lookup(np.asarray(seq.token_ids, dtype=np.int64), k, self.min_n, self.max_n) if k > 0 else []
                for seq, k in zip(seqs, ks)]

    def release_finished(self) -> None:
        """Nothing is held per sequence."""


def lookup(tokens: np.ndarray, k: int, min_n: int, max_n: int) -> list[int]:
    """The k tokens after the most recent earlier occurrence of tokens' longest matching suffix n-gram.

    tokens: [L]. An earlier occurrence starts at i < L - n (it may overlap the suffix), so at least one
    token follows it."""
    length = len(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        windows = sliding_window_view(tokens[:length - 1], n)  # [L - n, n]: every n-gram but the suffix itself
        hits = np.flatnonzero((windows == tokens[length - n:]).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n  # most recent occurrence
            return tokens[start:start + k].tolist()
    return []
