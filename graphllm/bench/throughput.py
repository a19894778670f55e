"""`graphllm bench throughput`: N requests submitted at once, run to completion; tokens per second.

Input and output lengths are uniform in [--min-len, --max-len], drawn independently from
`random.Random(--seed)`, which also draws the prompt token ids; every request generates exactly
its output length (greedy, ignore_eos). The scheduler batches them as it would in serving
(continuous batching, chunked prefill, preemption under KV pressure).

With `--compare transformers`, transformers runs the first `--compare-num-requests` of the same
requests (it is slow), and the engine runs those same requests again, so the ratio compares
like with like; the engine's full run is reported beside it.
"""

import argparse
import time
from pathlib import Path

from graphllm.bench import hf_compare, plots, profiling
from graphllm.bench.workload import (BenchRequest, StepTimer, add_common_args, build_engine, engine_facts, fmt,
                                     format_rows, free_engine, make_requests, model_folder, params_for,
                                     prepare_work, summarize_run, synchronizer, warm_up, write_report)

DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
RATES = ("output_tok_s", "total_tok_s", "requests_s")


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register `throughput` under `graphllm bench`."""
    p = subparsers.add_parser("throughput", help="offline throughput of many random-length requests at once")
    add_common_args(p, max_num_seqs=DEFAULT_MAX_NUM_SEQS)
    p.add_argument("--num-requests", type=int, default=1024)
    p.add_argument("--min-len", type=int, default=100, help="shortest input and output, in tokens")
    p.add_argument("--max-len", type=int, default=1024, help="longest input and output, in tokens")
    p.add_argument("--hf-batch-size", type=int, default=64, help="transformers generate batch (--compare)")
    p.add_argument("--compare-num-requests", type=int, default=256,
                   help="transformers runs only this many of the requests (the first ones)")
    p.set_defaults(func=main)
    return p


def run_requests(engine, requests: list[BenchRequest]) -> dict:
    """Submit every request to one `generate`; wall time from submission to the last token."""
    timer, sync = StepTimer(engine), synchronizer(engine.state.device)
    preempted = engine.scheduler.num_preemptions
    try:
        sync()
        start = time.perf_counter()
        outs = engine.generate([r.prompt for r in requests], [params_for(r.output_len) for r in requests])
        sync()
        wall = time.perf_counter() - start
    finally:
        timer.remove()
    generated = [len(o.outputs[0].token_ids) for o in outs]
    return summarize_run(requests, generated, wall) | {
        "steps": len(timer.records), "preemptions": engine.scheduler.num_preemptions - preempted,
        "step_breakdown_ms": timer.summary(), "step_table": timer.step_table()}


def profile_prompts(engine, requests: list[BenchRequest]) -> list[list[int]]:
    """The largest batch of the shortest prompt length: the prefill chunks, then a full decode batch."""
    n = min(engine.state.limits.max_num_seqs, len(requests))
    length = min(len(r.prompt) for r in requests)
    return [r.prompt[:length] for r in requests[:n]]


def format_table(report: dict) -> str:
    runs = [("engine", report["ours"])]
    if "ours_on_compared" in report:
        runs.append(("engine (compared subset)", report["ours_on_compared"]))
    if "transformers" in report:
        runs.append(("transformers", report["transformers"]))
    rows = [("run", "requests", "wall s", "req/s", "output tok/s", "total tok/s")]
    rows += [(name, r["num_requests"], f"{r['wall_s']:.2f}", f"{r['requests_s']:.2f}", f"{r['output_tok_s']:.1f}",
              f"{r['total_tok_s']:.1f}") for name, r in runs]
    lines = [format_rows(rows, left=1)]
    if "ours_on_compared" in report:
        lines.append(f"transformers ran the first {report['transformers']['num_requests']} of "
                     f"{len(report['requests'])} requests; the ratio compares the engine on those same requests")
    if "ratio" in report:
        lines.append("ours / transformers: " + ", ".join(f"{k} {fmt(v, '.2f')}" for k, v in report["ratio"].items()))
    for phase, d in report["ours"]["step_breakdown_ms"].items():
        lines.append(f"{phase} steps: {d['steps']}, mean {d['total_ms']:.2f} ms = schedule {d['schedule_ms']:.2f} "
                     f"+ model {d['model_ms']:.2f} + sample {d['sample_ms']:.2f} + rest {d['rest_ms']:.2f}")
    return "\n".join(lines)


def check_args(args: argparse.Namespace) -> None:
    if args.num_requests < 1 or args.hf_batch_size < 1 or args.compare_num_requests < 1:
        raise ValueError("--num-requests, --hf-batch-size and --compare-num-requests must be positive")
    if not 1 <= args.min_len <= args.max_len:
        raise ValueError(f"need 1 <= --min-len <= --max-len, got {args.min_len} and {args.max_len}")


def main(args: argparse.Namespace) -> int:
    check_args(args)
    if args.plot:
        plots.require_matplotlib()  # fail before a long run, not after it
    work = prepare_work(args)
    model_dir = model_folder(args, work)
    engine = build_engine(args, model_dir, DEFAULT_MAX_NUM_SEQS, 2 * args.max_len + 16, DEFAULT_MAX_NUM_BATCHED_TOKENS)
    requests = make_requests(args.num_requests, args.min_len, args.max_len,
                             engine.state.model_config.vocab_size, args.seed)
    longest = max(len(r.prompt) + r.output_len for r in requests)
    if longest > engine.state.max_model_len:
        raise ValueError(f"a request needs {longest} tokens; --max-model-len is {engine.state.max_model_len}")
    report = {"benchmark": "throughput", "args": {k: v for k, v in vars(args).items() if k != "func"},
              "engine": engine_facts(engine),
              "requests": [{"input_len": len(r.prompt), "output_len": r.output_len} for r in requests]}
    warm_up(engine, min(engine.state.limits.max_num_seqs, 8), args.min_len)
    report["ours"] = run_requests(engine, requests)
    print(f"engine: {report['ours']['output_tok_s']:.1f} output tok/s", flush=True)
    compared = requests[:args.compare_num_requests] if args.compare else requests
    if len(compared) < len(requests):
        report["ours_on_compared"] = run_requests(engine, compared)
    if args.profile:
        report["profile"] = profiling.profile_engine(engine, profile_prompts(engine, requests), args.profile_steps,
                                                     Path(args.profile))
        print(profiling.format_profile(report["profile"]))
    dtype, device = engine.state.dtype, engine.state.device
    del engine
    free_engine()
    if args.compare:
        report["transformers"] = hf_compare.throughput(model_dir, dtype, device, compared, args.hf_batch_size)
        ours = report.get("ours_on_compared", report["ours"])
        report["ratio"] = hf_compare.ratios(ours, report["transformers"], RATES)
    return write_report(report, args, format_table(report), plots.plot_throughput)
