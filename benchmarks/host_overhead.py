"""Host (Python) time per engine step outside the model, at a large decode batch.

Builds an eager Engine on the tiny random Llama of tests/tiny_models.py (positions raised so
sequences can grow past 256 tokens), runs N requests of a P-token prompt with max_tokens=M
(ignore_eos), and reports the time per step spent outside `engine.runner.execute`: scheduling,
sampling, stop checks, detokenization and output snapshots. Model time is subtracted by
wrapping `execute` on the instance. --api step drives `engine.step()` and keeps every output
(what `stream` and the server consume); --api generate runs one `engine.generate()`.

    python benchmarks/host_overhead.py [--requests 256] [--prompt-len 64] [--max-tokens 512] [--api step]
"""

import argparse
import cProfile
import pstats
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.tiny_models import CONFIGS, COMMON, save_model_folder  # noqa: E402

from graphllm import Engine, SamplingParams  # noqa: E402


def tiny_llama(max_positions: int) -> transformers.PreTrainedModel:
    config_cls, extra = CONFIGS["llama"]
    config = getattr(transformers, config_cls)(**{**COMMON, "max_position_embeddings": max_positions}, **extra)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


def timed_execute(engine: Engine) -> list[tuple[float, float]]:
    """Wrap engine.runner.execute so that each call's (wall, thread CPU) time is recorded."""
    model_times, execute = [], engine.runner.execute

    def wrapped(batch):
        start, start_cpu = time.perf_counter(), time.thread_time()
        out = execute(batch)
        model_times.append((time.perf_counter() - start, time.thread_time() - start_cpu))
        return out

    engine.runner.execute = wrapped
    return model_times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--logprobs", type=int, default=None)
    ap.add_argument("--api", choices=["step", "generate"], default="step")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    max_len = args.prompt_len + args.max_tokens
    with tempfile.TemporaryDirectory() as tmp:
        path = save_model_folder(tiny_llama(max_len), Path(tmp))
        engine = Engine.from_pretrained(path, max_num_seqs=args.requests, max_model_len=max_len,
                                        max_num_batched_tokens=max(2048, args.requests),
                                        num_kv_blocks=args.requests * (-(-max_len // 16)))
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True,
                            logprobs=args.logprobs)
    prompts = [[1] + [3 + (7 * r + i) % 120 for i in range(args.prompt_len - 1)] for r in range(args.requests)]
    model_times = timed_execute(engine)
    profiler = cProfile.Profile() if args.profile else None
    start, start_cpu = time.perf_counter(), time.thread_time()
    if profiler:
        profiler.enable()
    if args.api == "generate":
        finished = sum(out.finished for out in engine.generate(prompts, params))
    else:
        for p in prompts:
            engine.add_request(p, params)
        finished = 0
        while engine.has_unfinished_requests():  # outputs dropped as read, as a server does
            finished += sum(out.finished for out in engine.step())
    steps = len(model_times)
    if profiler:
        profiler.disable()
    total, total_cpu = time.perf_counter() - start, time.thread_time() - start_cpu
    assert finished == args.requests
    model, model_cpu = (sum(t) for t in zip(*model_times))
    # CPU time is the steadier number on a shared machine; wall time includes waiting for a core.
    print(f"{steps} steps; outside execute per step: {1e3 * (total_cpu - model_cpu) / steps:.3f} ms CPU, "
          f"{1e3 * (total - model) / steps:.3f} ms wall (model {model:.1f} s wall of {total:.1f} s)")
    if profiler:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
