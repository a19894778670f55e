"""`graphllm bench throughput`: N requests submitted at once, run to completion; tokens per second.

Input and output lengths are uniform in [--min-len, --max-len], drawn independently from
`random.Random(--seed)`, which also draws the prompt token ids; every request generates exactly
its output length (greedy, ignore_eos). The scheduler batches them as it would in serving
(continuous batching, chunked prefill, preemption under KV pressure).

`--structured-fraction F` constrains every (1/F)-th request's output with a JSON schema
(workload.STRUCTURED_SCHEMA, whose array needs more items than any output holds, so those requests
generate their full length like the others; on a preset without a tokenizer, against a synthetic
vocabulary of the model's size).

`--workload shared-prefix` (the prefix-caching benchmark): every prompt is one of `--num-prefixes`
random system prompts of `--prefix-len` tokens, then `--suffix-len` random tokens of its own, and
asks for `--output-len` tokens; the report adds time to first token (submission to the first sampled
token of each request: mean, median, p90) and the prefix cache's hit rate. Run it once with and once
with `--no-enable-prefix-caching`, on the same machine, to compare.

The report sets the run against the workload's roofline (graphllm/bench/roofline.py: its matmul and attention
FLOPs at the measured matmul rate plus its KV-cache bytes at the measured copy bandwidth; `--gemm-tflops` and
`--bandwidth-tbs` give them instead, and on CPU nothing is measured), and splits the wall time between the steps
that carry prompt tokens (prefill and mixed) and the decode steps.

With `--compare transformers`, transformers runs the first `--compare-num-requests` of the same
requests (it is slow), and the engine runs those same requests again, so the ratio compares
like with like; the engine's full run is reported beside it.
"""

import argparse
import dataclasses
import random
import statistics
import time
from pathlib import Path

from graphllm.bench import hf_compare, plots, profiling, roofline
from graphllm.bench.workload import (BenchRequest, StepTimer, add_common_args, build_engine, engine_facts, fmt,
                                     format_rows, free_engine, make_requests, model_dtype, model_folder,
                                     params_for, prepare_work, random_prompt, summarize_run, synchronizer,
                                     synthetic_vocabulary, warm_up, write_report)
from graphllm.device import resolve_device

DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
RATES = ("output_tok_s", "total_tok_s", "requests_s")


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register `throughput` under `graphllm bench`."""
    p = subparsers.add_parser("throughput", help="offline throughput of many random-length requests at once")
    add_common_args(p, max_num_seqs=DEFAULT_MAX_NUM_SEQS)
    roofline.add_ceiling_args(p, gemm=True)
    p.add_argument("--num-requests", type=int, default=1024)
    p.add_argument("--min-len", type=int, default=100, help="shortest input and output, in tokens")
    p.add_argument("--max-len", type=int, default=1024, help="longest input and output, in tokens")
    p.add_argument("--workload", choices=("random", "shared-prefix"), default="random",
                   help="random: lengths in [--min-len, --max-len]; shared-prefix: --num-prefixes system prompts "
                        "of --prefix-len tokens, each request one of them + --suffix-len tokens of its own")
    p.add_argument("--num-prefixes", type=int, default=8)
    p.add_argument("--prefix-len", type=int, default=2048)
    p.add_argument("--suffix-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128, help="shared-prefix: tokens each request generates")
    p.add_argument("--structured-fraction", type=float, default=0.0,
                   help="this share of the requests (every k-th) is constrained by a JSON schema "
                        "(structured output); compare against 0 in the same call")
    p.add_argument("--hf-batch-size", type=int, default=64, help="transformers generate batch (--compare)")
    p.add_argument("--compare-num-requests", type=int, default=256,
                   help="transformers runs only this many of the requests (the first ones)")
    p.set_defaults(func=main)
    return p


def shared_prefix_requests(args: argparse.Namespace, vocab: int) -> list[BenchRequest]:
    """--num-requests prompts, each one of --num-prefixes shared system prompts + its own suffix."""
    if min(args.num_prefixes, args.prefix_len, args.suffix_len, args.output_len) < 1:
        raise ValueError("--num-prefixes, --prefix-len, --suffix-len and --output-len must be positive")
    rng = random.Random(args.seed)
    prefixes = [random_prompt(rng, args.prefix_len, vocab) for _ in range(args.num_prefixes)]
    return [BenchRequest(prefixes[rng.randrange(args.num_prefixes)] + random_prompt(rng, args.suffix_len, vocab),
                         args.output_len) for _ in range(args.num_requests)]


def run_requests(engine, requests: list[BenchRequest], first_token_times: bool = False) -> dict:
    """Submit every request at once and step to the end; wall time from submission to the last token.
    first_token_times: also each request's time to its first token (read from its sequence after every
    step, which costs a pass over the requests still waiting for one)."""
    timer, sync = StepTimer(engine), synchronizer(engine.state.device)
    preempted, pool = engine.scheduler.num_preemptions, engine.pool
    queries, hits = pool.prefix_cache_queries, pool.prefix_cache_hits
    try:
        sync()
        start = time.perf_counter()
        ids = [engine.add_request(r.prompt, params_for(r.output_len, r.structured)) for r in requests]
        waiting = {i: engine.requests[i].seqs[0] for i in ids} if first_token_times else {}
        for i in ids:  # only the final outputs are kept (as generate does)
            engine.requests[i].report_progress = False
        ttft, finished = [], {}
        while len(finished) < len(ids):
            for out in engine.step():
                if out.finished:
                    finished[out.request_id] = out
            if waiting:
                now = time.perf_counter() - start
                for i in [i for i, seq in waiting.items() if seq.num_resolved_output_tokens]:
                    ttft.append(now)
                    del waiting[i]
        sync()
        wall = time.perf_counter() - start
    finally:
        timer.remove()
    generated = [len(finished[i].outputs[0].token_ids) for i in ids]
    structured = [n for r, n in zip(requests, generated) if r.structured]
    report = summarize_run(requests, generated, wall) | {
        "structured_requests": len(structured), "structured_output_tokens": sum(structured),
        "steps": len(timer.records), "preemptions": engine.scheduler.num_preemptions - preempted,
        "prefix_cache": {"enabled": pool.enable_prefix_caching, "queried_tokens": pool.prefix_cache_queries - queries,
                         "hit_tokens": pool.prefix_cache_hits - hits},
        "step_breakdown_ms": timer.summary(), "step_table": timer.step_table()}
    if first_token_times:
        ttft.sort()
        report["ttft_s"] = {"mean": statistics.fmean(ttft), "median": statistics.median(ttft),
                            "p90": ttft[int(0.9 * (len(ttft) - 1))]}
    return report


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
    ours = report["ours"]
    if ours["structured_requests"]:
        lines.append(f"structured output: {ours['structured_requests']} requests, "
                     f"{ours['structured_output_tokens']} of {ours['output_tokens']} output tokens")
    cache = ours["prefix_cache"]
    lines.append(f"prefix cache {'on' if cache['enabled'] else 'off'}: {cache['hit_tokens']} of "
                 f"{cache['queried_tokens']} prompt tokens hit")
    if "ttft_s" in ours:
        lines.append("time to first token: mean {mean:.3f} s, median {median:.3f} s, p90 {p90:.3f} s".format(
            **ours["ttft_s"]))
    split = ours.get("wall_split", {})
    for phase, d in ours["step_breakdown_ms"].items():
        share = split.get(phase, {}).get("share")
        gpu = f", GPU timeline {d['gpu_ms']:.2f} ms a step" if "gpu_ms" in d else ""
        lines.append(f"{phase} steps: {d['steps']}, mean {d['total_ms']:.2f} ms = schedule {d['schedule_ms']:.2f} "
                     f"+ model {d['model_ms']:.2f} + sample {d['sample_ms']:.2f} + rest {d['rest_ms']:.2f}{gpu}; "
                     f"{split.get(phase, {}).get('seconds', 0):.2f} s in all ({fmt(share, '.1%')} of the wall time"
                     f"{', by the GPU timeline' if gpu else ''})")
    if "roofline" in report:
        lines.append(format_roofline(report["roofline"], report["ceilings"], ours["output_tok_s"]))
    if floor := report.get("schedule_floor"):
        lines.append(f"schedule floor: {floor['floor_s']:.4g} s for this run's {floor['steps']} steps (each step's "
                     f"matmuls or weight read {floor['matmul_or_weights_s']:.4g} s + KV {floor['kv_s']:.4g} s); "
                     f"the wall time is {ours['wall_s'] / floor['floor_s']:.2f}x it")
        for phase, f in floor.get("phases", {}).items():
            spent = split.get(phase, {})
            if spent.get("source") == "gpu" and f["floor_s"]:
                lines.append(f"  {phase} steps: {spent['seconds']:.4g} s of GPU timeline against their floor "
                             f"{f['floor_s']:.4g} s ({spent['seconds'] / f['floor_s']:.2f}x)")
    return "\n".join(lines)


def format_roofline(r: dict, ceilings: dict, achieved: float) -> str:
    work = (f"{r['matmul_flop']:.3g} matmul + {r['attention_flop']:.3g} attention FLOP, "
            f"{r['kv_bytes'] / 1e12:.3g} TB of KV cache")
    if r["output_tok_s"] is None:
        return f"roofline: none ({ceilings['source']}; {ceilings['gemm_source']}; give --bandwidth-tbs and " \
               f"--gemm-tflops): the workload is {work}"
    return (f"roofline: {r['output_tok_s']:.1f} output tok/s = {r['floor_s']:.4g} s ({work}: compute "
            f"{r['compute_s']:.4g} s at {ceilings['gemm_tflops']:.4g} TFLOP/s, KV {r['kv_s']:.4g} s at "
            f"{ceilings['bandwidth_tbs']:.4g} TB/s); achieved {achieved / r['output_tok_s']:.1%}")


def add_roofline(report: dict, engine, model_dir: Path) -> None:
    """report["roofline"] and report["schedule_floor"] of the engine's run (report["ours"]), and
    report["ours"]["wall_split"]."""
    state, ours = engine.state, report["ours"]
    weights = report["weights"] = roofline.engine_weight_bytes(state, model_dir)
    kv_per_token = state.kv_cache_bytes / (state.num_kv_blocks * state.limits.block_size)
    requests = [(r["input_len"], g) for r, g in zip(report["requests"], ours["generated_tokens"])]
    c = report["ceilings"]
    report["roofline"] = roofline.workload_roofline(requests, weights, state.model_config, kv_per_token,
                                                    c["gemm_tflops"], c["bandwidth_tbs"])
    report["schedule_floor"] = roofline.schedule_floor(ours["step_table"], weights, state.model_config, kv_per_token,
                                                       c["gemm_tflops"], c["bandwidth_tbs"])
    ours["wall_split"] = roofline.wall_split(ours["step_breakdown_ms"], ours["wall_s"])
    if report["roofline"]["output_tok_s"]:
        ours["roofline_share"] = ours["output_tok_s"] / report["roofline"]["output_tok_s"]


def check_args(args: argparse.Namespace) -> None:
    if not 0 <= args.structured_fraction <= 1:
        raise ValueError(f"--structured-fraction must be in [0, 1], got {args.structured_fraction}")
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
    shared = args.workload == "shared-prefix"
    longest = args.prefix_len + args.suffix_len + args.output_len if shared else 2 * args.max_len
    device = resolve_device(args.device)
    ceilings = roofline.device_ceilings(args, device, model_dtype(args, model_dir, device))  # before the KV cache
    engine = build_engine(args, model_dir, DEFAULT_MAX_NUM_SEQS, longest + 16, DEFAULT_MAX_NUM_BATCHED_TOKENS)
    vocab = engine.state.model_config.vocab_size
    requests = (shared_prefix_requests(args, vocab) if shared
                else make_requests(args.num_requests, args.min_len, args.max_len, vocab, args.seed))
    longest = max(len(r.prompt) + r.output_len for r in requests)
    if longest > engine.state.max_model_len:
        raise ValueError(f"a request needs {longest} tokens; --max-model-len is {engine.state.max_model_len}")
    report = {"benchmark": "throughput", "args": {k: v for k, v in vars(args).items() if k != "func"},
              "engine": engine_facts(engine), "ceilings": ceilings,
              "requests": [{"input_len": len(r.prompt), "output_len": r.output_len} for r in requests]}
    warm_up(engine, min(engine.state.limits.max_num_seqs, 8), args.min_len)
    if args.structured_fraction:
        if engine.tokenizer is None:  # a preset: grammars match a synthetic vocabulary of the model's size
            engine.structured_outputs.use_vocabulary(synthetic_vocabulary(vocab))
        every = max(1, round(1 / args.structured_fraction))
        requests = [dataclasses.replace(r, structured=i % every == 0) for i, r in enumerate(requests)]
    report["ours"] = run_requests(engine, requests, first_token_times=shared)
    add_roofline(report, engine, model_dir)
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
