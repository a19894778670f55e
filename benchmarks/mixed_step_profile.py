"""Where a mixed step's time goes (GPU runs): decodes plus one admitted prompt, as in offline throughput.

    python benchmarks/mixed_step_profile.py MODEL_DIR OUT.json [--decoding 255] [--context 800] [--new 400]
        [--quantization fp8] [--kv-cache-dtype fp8] [--xqa-mixed]

Fills the engine with `--decoding` sequences past their prompts of `--context` tokens, then
times, several times each: a pure decode step (CUDA graph), a mixed step (those decodes plus a
new `--new`-token prompt, the compiled graph run directly), and a prefill-only step of the same
prompt on an otherwise idle engine. One mixed step and one prefill step run under
torch.profiler: host (CPU) time of the step, the sum of GPU kernel time, the kernels launched,
and the top kernels are reported, so launch-bound and kernel-bound steps can be told apart.
"""

import argparse
import json
import random
import time

import torch

from graphllm.runtime.engine import Engine
from graphllm.runtime.sampling_params import SamplingParams

def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


LIMITS = dict(max_num_seqs=256, max_model_len=2064, max_num_batched_tokens=8192)


def prompt(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(3, vocab) for _ in range(n)]


def timed_step(engine: Engine) -> float:
    sync()
    start = time.perf_counter()
    engine.step()
    sync()
    return 1e3 * (time.perf_counter() - start)


def profile_step(engine: Engine) -> dict:
    from torch.profiler import ProfilerActivity, profile
    sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        engine.step()
        sync()
        wall = 1e3 * (time.perf_counter() - start)
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    by_name: dict[str, list[float]] = {}
    for e in kernels:
        by_name.setdefault(e.name, []).append(e.device_time / 1e3)
    top = sorted(((sum(v), len(v), k) for k, v in by_name.items()), reverse=True)[:12]
    launches = [e for e in prof.events() if e.name in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC",
                                                        "cuLaunchKernelEx")]
    return {"wall_ms": wall, "gpu_kernel_ms": sum(sum(v) for v in by_name.values()), "kernels": len(kernels),
            "launch_calls": len(launches), "launch_cpu_ms": sum(e.cpu_time_total for e in launches) / 1e3,
            "top": [{"ms": round(t, 3), "calls": n, "name": k[:90]} for t, n, k in top]}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("out")
    p.add_argument("--decoding", type=int, default=255)
    p.add_argument("--context", type=int, default=800)
    p.add_argument("--new", type=int, default=400)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--max-model-len", type=int, default=LIMITS["max_model_len"])
    p.add_argument("--quantization", default=None)
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--xqa-mixed", action="store_true", help="EngineConfig.xqa_mixed: a mixed step's decodes via XQA")
    args = p.parse_args()
    engine = Engine.from_pretrained(args.model, compile=torch.cuda.is_available(), quantization=args.quantization,
                                    kv_cache_dtype=args.kv_cache_dtype, xqa_mixed=args.xqa_mixed,
                                    **(LIMITS | {"max_model_len": args.max_model_len}))
    vocab, rng = engine.state.model_config.vocab_size, random.Random(0)
    long = SamplingParams(max_tokens=1000, ignore_eos=True)
    report = {"args": vars(args)}

    # prefill-only steps: the new prompt alone on an idle engine
    times = []
    for _ in range(args.reps + 1):  # the first one warms up
        rid = engine.add_request(prompt(rng, args.new, vocab), long)
        times.append(timed_step(engine))
        engine.abort(rid)
    report["prefill_only_ms"] = times[1:]
    rid = engine.add_request(prompt(rng, args.new, vocab), long)
    report["prefill_profile"] = profile_step(engine)
    engine.abort(rid)

    # fill with decoding sequences
    for _ in range(args.decoding):
        engine.add_request(prompt(rng, args.context, vocab), long)
    while any(s.num_computed_tokens < s.num_prompt_tokens for s in engine.scheduler.running) or engine.scheduler.waiting:
        engine.step()
    report["decode_ms"] = [timed_step(engine) for _ in range(args.reps)]
    mixed = []
    for _ in range(args.reps):
        rid = engine.add_request(prompt(rng, args.new, vocab), long)
        mixed.append(timed_step(engine))
        engine.abort(rid)
    report["mixed_ms"] = mixed
    rid = engine.add_request(prompt(rng, args.new, vocab), long)
    report["mixed_profile"] = profile_step(engine)
    engine.abort(rid)
    report["decode_profile"] = profile_step(engine)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    med = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
    print(f"prefill-only {args.new} tokens: {med(report['prefill_only_ms']):.2f} ms; decode {args.decoding}: "
          f"{med(report['decode_ms']):.2f} ms; mixed: {med(mixed):.2f} ms")
    for name in ("prefill_profile", "mixed_profile", "decode_profile"):
        r = report[name]
        print(f"{name}: wall {r['wall_ms']:.2f} ms, GPU kernels {r['gpu_kernel_ms']:.2f} ms in {r['kernels']} kernels, "
              f"{r['launch_calls']} launch calls taking {r['launch_cpu_ms']:.2f} ms of CPU")
        for t in r["top"][:12]:
            print(f"    {t['ms']:8.3f} ms {t['calls']:4d}x {t['name']}")


if __name__ == "__main__":
    main()
