"""OracleProposer: a benchmark-only proposer that knows the answer (issue 21's GPU benchmark).

Random weights propose nothing useful, so `graphllm bench spec` measures the mechanism itself: a plain
run of the prompts records each one's greedy continuation (`expect`), and then the oracle proposes from
it, each proposed token right with a probability chosen so that the share of proposed tokens the target
accepts is `acceptance_rate` on average (`per_token_probability`), a wrong one being the right token + 1.
Greedy verification is exact, so the accepted tokens are the reference's and the continuation stays on it.
Requests it has no reference for get no proposals (the plain run). `num_tokens` caps k below the engine's
num_speculative_tokens, so one engine serves every k of a sweep.
"""

import functools
import random

from graphllm.runtime.sequence import Sequence


def expected_acceptance(p: float, k: int) -> float:
    """The share of k proposed tokens accepted when each is right with probability p, independently: the
    accepted run is the prefix up to the first wrong one, E = (p + p^2 + ... + p^k) / k."""
    return sum(p ** j for j in range(1, k + 1)) / k


@functools.lru_cache(maxsize=None)  # asked once per proposal: the bisection costs ~0.1 ms, inside a step
def per_token_probability(rate: float, k: int) -> float:
    """p with expected_acceptance(p, k) == rate (bisection; it grows with p from 0 to 1)."""
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"acceptance rate must lie in [0, 1], got {rate}")
    low, high = 0.0, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if expected_acceptance(mid, k) < rate else (low, mid)
    return high if rate == 1.0 else (low + high) / 2


class OracleProposer:
    max_model_len: int | None = None  # no limit of its own

    def __init__(self, vocab_size: int, seed: int = 0):
        self.vocab_size = vocab_size
        self.references: dict[tuple[int, ...], list[int]] = {}  # prompt token ids -> its greedy continuation
        self.num_tokens: int | None = None  # cap on k (None: the engine's)
        self.acceptance_rate = 1.0
        self.rng = random.Random(seed)

    def expect(self, prompt: list[int], continuation: list[int]) -> None:
        self.references[tuple(prompt)] = list(continuation)

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[list[int]]:
        out = []
        for seq, k in zip(seqs, ks):
            reference = self.references.get(tuple(seq.prompt_token_ids))
            k = min(k, self.num_tokens or k)
            if reference is None or k <= 0:
                out.append([])
                continue
            done = seq.num_output_tokens
            p = per_token_probability(self.acceptance_rate, k)
            right = reference[done:done + k]
            out.append([t if self.rng.random() < p else (t + 1) % self.vocab_size for t in right])
        return out

    def release_finished(self) -> None:
        """Nothing is held per sequence."""
