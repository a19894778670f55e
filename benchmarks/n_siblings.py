"""Tokens computed and wall time of one request with n sequences over a long prompt (and of the same prompt sent
as n requests of one sequence each): the sequences waiting for the first to cache the prompt (the scheduler's
default) against all of them prefilling it side by side (as before 2026-12-07), with the same tokens out.

    PYTHONPATH=. python benchmarks/n_siblings.py [N] [PROMPT_TOKENS]     # the demo model; CPU is enough
"""

import sys
import time

from graphllm import Engine, EngineConfig, SamplingParams
from graphllm.runtime.scheduler import Scheduler


def measure(engine: Engine, prompts: list[list[int]], params: SamplingParams) -> tuple[float, int, list]:
    """(seconds, tokens computed, every sequence's tokens) of the prompts' requests, from a cold prefix cache."""
    engine.reset_prefix_cache()
    computed, schedule = [], engine.scheduler.schedule

    def counting():
        batch = schedule()
        computed.append(sum(s.num_new_tokens for s in batch))
        return batch
    engine.scheduler.schedule = counting
    try:
        start = time.perf_counter()
        out = engine.generate(prompts, params)
        seconds = time.perf_counter() - start
    finally:
        engine.scheduler.schedule = schedule
    return seconds, sum(computed), [c.token_ids for o in out for c in o.outputs]


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    length = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
    engine = Engine(EngineConfig(max_num_batched_tokens=4096))
    vocab = engine.limits.vocab_size
    prompt = [5 + (i * 7) % (vocab - 10) for i in range(length)]
    engine.generate([prompt[:50]], SamplingParams(max_tokens=2))  # warm-up
    for name, prompts, params in (
            (f"one request, n={n}", [prompt], SamplingParams(n=n, temperature=0.8, seed=1, max_tokens=16,
                                                             ignore_eos=True)),
            (f"{n} requests of the same prompt", [prompt] * n, SamplingParams(temperature=0.8, seed=1, max_tokens=16,
                                                                             ignore_eos=True))):
        waiting = measure(engine, prompts, params)
        waits = Scheduler._waits_for_prompt
        Scheduler._waits_for_prompt = lambda self, seq, hits, in_flight: False  # side by side
        try:
            side_by_side = measure(engine, prompts, params)
        finally:
            Scheduler._waits_for_prompt = waits
        for how, (seconds, tokens, _) in (("waiting for the prompt", waiting), ("side by side", side_by_side)):
            print(f"{name}, {length}-token prompt, {how}: {tokens} tokens computed, {seconds:.2f} s")
        print("same tokens:", waiting[2] == side_by_side[2])


if __name__ == "__main__":
    main()
