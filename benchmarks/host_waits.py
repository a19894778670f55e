"""Where the host waits for the GPU under async scheduling (a GPU diagnostic).

Runs a throughput-like workload (sequences finishing at different steps, prompts arriving while
others decode) on a compiled engine and, after a warm-up, records for some steps:
- every synchronizing PyTorch operation (torch.cuda.set_sync_debug_mode), by the graphllm line
  that called it;
- the CUDA runtime calls that can block the host (synchronize, malloc/free, host alloc, blocking
  memcpy), with their count, host time and the graphllm frames above them (torch.profiler);
- the host time of each part of a step call, for decode and for mixed steps.

    python benchmarks/host_waits.py MODEL_DIR OUT.json [--steps 120]
"""

import argparse
import collections
import json
import random
import time
import traceback
import warnings

import torch
from torch.profiler import ProfilerActivity, profile

from graphllm import Engine, SamplingParams

BLOCKING = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMalloc", "cudaFree",
            "cudaHostAlloc", "cudaFreeHost", "cudaMemcpy", "cudaHostRegister")


def graphllm_frames(stack) -> str:
    return " < ".join(f"{f.filename.split('graphllm/')[-1]}:{f.lineno}" for f in reversed(stack)
                      if "/graphllm/" in f.filename)[:400]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=120)
    args = ap.parse_args()
    engine = Engine.from_pretrained(args.model, compile=True, max_num_seqs=256, max_model_len=2064,
                                    max_num_batched_tokens=8192, attention_backend="triton")
    assert engine.async_scheduling
    rng = random.Random(0)
    vocab = engine.state.model_config.vocab_size
    for _ in range(600):
        prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(100, 600))]
        engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=rng.randint(20, 300), ignore_eos=True))
    for _ in range(60):  # warm-up: the batch fills, the first sequences finish
        engine.step()
    torch.cuda.synchronize()

    syncs = collections.Counter()
    original = warnings.showwarning

    def record(message, category, filename, lineno, file=None, line=None):
        syncs[f"{str(message)[:60]} @ {graphllm_frames(traceback.extract_stack()[:-1])}"] += 1

    parts = collections.defaultdict(list)  # (phase, part) -> host seconds
    execute, wait = engine.runner.execute, engine.step_loop._wait_for_tokens

    def timed(name, fn):
        def call(*a, **kw):
            start = time.perf_counter()
            out = fn(*a, **kw)
            parts[name].append(time.perf_counter() - start)
            return out
        return call

    schedule, shapes = engine.scheduler.schedule, []

    def scheduled():
        batch = schedule()
        shapes.append(any(s.seq.num_computed_tokens < s.seq.num_prompt_tokens for s in batch))
        return batch

    engine.scheduler.schedule = scheduled
    engine.runner.execute = timed("execute", execute)
    engine.step_loop._wait_for_tokens = timed("wait", wait)
    calls = []
    warnings.showwarning = record
    torch.cuda.set_sync_debug_mode(1)
    with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
        for _ in range(args.steps):
            before = {k: len(v) for k, v in parts.items()}
            start = time.perf_counter()
            engine.step()
            total = time.perf_counter() - start
            calls.append({"prefill": shapes[-1], "total_ms": 1e3 * total,
                          **{f"{k}_ms": 1e3 * sum(v[before.get(k, 0):]) for k, v in parts.items()}})
    torch.cuda.set_sync_debug_mode(0)
    warnings.showwarning = original
    torch.cuda.synchronize()

    runtime = collections.defaultdict(lambda: {"count": 0, "host_ms": 0.0})
    for e in prof.events():
        if e.name in BLOCKING:
            key = f"{e.name} @ {' < '.join(f for f in e.stack if 'graphllm' in f)[:400]}"
            runtime[key]["count"] += 1
            runtime[key]["host_ms"] += e.cpu_time_total / 1e3
    report = {"steps": args.steps, "sync_ops": dict(syncs.most_common(30)),
              "runtime_calls": dict(sorted(runtime.items(), key=lambda kv: -kv[1]["host_ms"])[:30]), "calls": calls}
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(f"synchronizing torch ops in {args.steps} step calls:")
    for k, n in syncs.most_common(12):
        print(f"  {n:5d}  {k}")
    print("blocking CUDA runtime calls:")
    for k, v in list(report["runtime_calls"].items())[:15]:
        print(f"  {v['count']:5d}  {v['host_ms']:9.1f} ms  {k}")
    for phase in (False, True):
        rows = [c for c in calls if c["prefill"] is phase]
        if rows:
            mean = {k: sum(r.get(k, 0.0) for r in rows) / len(rows) for k in ("total_ms", "execute_ms", "wait_ms")}
            print(f"{'calls launching a prefill' if phase else 'decode-only calls'}: {len(rows)}, mean "
                  + ", ".join(f"{k} {v:.2f}" for k, v in mean.items()))


if __name__ == "__main__":
    main()
