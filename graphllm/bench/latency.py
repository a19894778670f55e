"""`graphllm bench latency`: one batch at a time, prefill then decode, against the bandwidth ceiling.

For each batch size B, B prompts of `--input-len` random token ids each ask for exactly
`--output-len` tokens (greedy, ignore_eos), all submitted at once to one engine built for the
largest B. Prefill time is the time until every sequence has its first token; decode time is
the rest; decode tok/s per sequence is (output_len - 1) / decode time.

The ceiling: a decode step reads every weight once (all but the input embedding, which is a
gather), so at best a step takes weight bytes / memory bandwidth, and one sequence gets
bandwidth / weight bytes tokens per second whatever the batch (B sequences: B times that,
less the KV reads this ceiling leaves out). Bandwidth is `--bandwidth-tbs`, else a device-to-device
copy measured here (GPU only; on CPU the ceiling is left out).
"""

import argparse
import random
import time
from pathlib import Path


from graphllm.bench import hf_compare, plots, profiling
from graphllm.bench.roofline import add_ceiling_args, bandwidth, engine_weight_bytes
from graphllm.bench.serve_bench import parse_levels
from graphllm.bench.workload import (StepTimer, add_common_args, build_engine, engine_facts, fmt, format_rows,
                                     free_engine, model_folder, params_for, prepare_work, random_prompt,
                                     synchronizer, warm_up, write_report)
from graphllm.device import resolve_device


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register `latency` under `graphllm bench`."""
    p = subparsers.add_parser("latency", help="prefill and decode speed per batch size, against the bandwidth ceiling")
    add_common_args(p, max_num_seqs=None)
    p.add_argument("--batch-sizes", type=parse_levels, default=(1, 8, 32, 128, 256), help="e.g. 1,8,32,128,256")
    p.add_argument("--input-len", type=int, default=128, help="prompt tokens per sequence")
    p.add_argument("--output-len", type=int, default=256, help="generated tokens per sequence (ignore_eos)")
    add_ceiling_args(p)
    p.set_defaults(func=main)
    return p


def latency_prompts(seed: int, batch_size: int, input_len: int, vocab: int) -> list[list[int]]:
    rng = random.Random(f"{seed}:latency:{batch_size}")  # str seeds are stable across processes
    return [random_prompt(rng, input_len, vocab) for _ in range(batch_size)]


def measure_batch(engine, timer: StepTimer, prompts: list[list[int]], output_len: int) -> dict:
    """One batch from submission to its last token, timed step by step."""
    sync, b = synchronizer(engine.state.device), len(prompts)
    ids = [engine.add_request(p, params_for(output_len)) for p in prompts]
    waiting_first, finished, first_at = set(ids), {}, None
    timer.reset()
    sync()
    start = time.perf_counter()
    while len(finished) < b:
        for out in engine.step():
            if out.outputs[0].token_ids:
                waiting_first.discard(out.request_id)
            if out.finished:
                finished[out.request_id] = out
        if first_at is None and not waiting_first:
            first_at = time.perf_counter()
    end = time.perf_counter()
    prefill_s, decode_s = first_at - start, end - first_at
    per_seq = (output_len - 1) / decode_s if decode_s > 0 else None
    return {"batch_size": b, "prefill_s": prefill_s, "prefill_tok_s": b * len(prompts[0]) / prefill_s,
            "decode_s": decode_s, "decode_tok_s_per_seq": per_seq, "decode_tok_s": per_seq and b * per_seq,
            "e2e_s": end - start, "e2e_tok_s": b * output_len / (end - start),
            "generated_tokens": [len(finished[i].outputs[0].token_ids) for i in ids],
            "step_breakdown_ms": timer.summary()}


def run_latency(engine, args: argparse.Namespace) -> list[dict]:
    vocab = engine.state.model_config.vocab_size
    warm_up(engine, max(args.batch_sizes), args.input_len)
    timer = StepTimer(engine)
    try:
        results = []
        for b in args.batch_sizes:
            results.append(measure_batch(engine, timer, latency_prompts(args.seed, b, args.input_len, vocab),
                                         args.output_len))
            r = results[-1]
            print(f"batch {b}: prefill {r['prefill_s'] * 1e3:.1f} ms, decode {fmt(r['decode_tok_s_per_seq'])} "
                  f"tok/s per sequence, {fmt(r['decode_tok_s'])} tok/s", flush=True)
        return results
    finally:
        timer.remove()


def add_ceiling_share(results: list[dict], per_seq_ceiling: float | None) -> None:
    for r in results:
        ok = per_seq_ceiling and r["decode_tok_s_per_seq"]
        r["ceiling_share"] = r["decode_tok_s_per_seq"] / per_seq_ceiling if ok else None


def format_table(report: dict) -> str:
    rows = [("batch", "prefill ms", "decode s", "tok/s/seq", "tok/s", "ceiling",
             "decode step ms sched/model/sample/rest", "step p50/p99 ms", "HF tok/s", "ours/HF")]
    for r in report["results"]:
        d = r["step_breakdown_ms"].get("decode")
        parts = "/".join(f"{d[f'{k}_ms']:.2f}" for k in ("schedule", "model", "sample", "rest")) if d else "-"
        tail = f"{d['p50_ms']:.2f}/{d['p99_ms']:.2f}" if d else "-"
        hf = r.get("transformers") or {}
        rows.append((r["batch_size"], f"{r['prefill_s'] * 1e3:.1f}", f"{r['decode_s']:.3f}",
                     fmt(r["decode_tok_s_per_seq"]), fmt(r["decode_tok_s"]), fmt(r["ceiling_share"], ".1%"), parts, tail,
                     fmt(hf.get("decode_tok_s")), fmt((r.get("ratio") or {}).get("decode_tok_s"), ".2f")))
    c = report["ceiling"]
    note = (f"ceiling: {c['tok_s_per_seq']:.1f} tok/s per sequence = {c['bandwidth_tbs']:.2f} TB/s "
            f"({c['source']}) / {report['weights']['decode_read_bytes'] / 1e9:.3g} GB of weights per step"
            if c["tok_s_per_seq"] else f"ceiling: none ({c['source']}; give --bandwidth-tbs)")
    return format_rows(rows) + "\n" + note


def check_args(args: argparse.Namespace) -> None:
    if args.input_len < 1 or args.output_len < 2:
        raise ValueError("--input-len must be at least 1 and --output-len at least 2 (decode needs a second token)")
    if min(args.batch_sizes) < 1:
        raise ValueError("--batch-sizes must be positive")
    if args.max_num_seqs is not None and args.max_num_seqs < max(args.batch_sizes):
        raise ValueError(f"--max-num-seqs {args.max_num_seqs} is smaller than the largest batch size: "
                         "that batch would not run at once")


def main(args: argparse.Namespace) -> int:
    check_args(args)
    if args.plot:
        plots.require_matplotlib()  # fail before a long run, not after it
    work = prepare_work(args)
    model_dir, max_b = model_folder(args, work), max(args.batch_sizes)
    device = resolve_device(args.device)
    report = {"benchmark": "latency", "args": {k: v for k, v in vars(args).items() if k != "func"}}
    report["ceiling"] = bandwidth(args, device)  # before the KV cache takes the free memory
    engine = build_engine(args, model_dir, max_b, args.input_len + args.output_len, max_b * args.input_len)
    if engine.state.max_model_len < args.input_len + args.output_len:
        raise ValueError(f"--max-model-len {engine.state.max_model_len} is shorter than --input-len + --output-len")
    report["engine"] = engine_facts(engine)
    report["results"] = run_latency(engine, args)
    weights = report["weights"] = engine_weight_bytes(engine.state, model_dir)
    tbs = report["ceiling"]["bandwidth_tbs"]
    report["ceiling"]["tok_s_per_seq"] = tbs * 1e12 / weights["decode_read_bytes"] if tbs else None
    add_ceiling_share(report["results"], report["ceiling"]["tok_s_per_seq"])
    if args.profile:
        prompts = latency_prompts(args.seed, max_b, args.input_len, engine.state.model_config.vocab_size)
        report["profile"] = profiling.profile_engine(engine, prompts, args.profile_steps, Path(args.profile))
        print(profiling.format_profile(report["profile"]))
    dtype, vocab = engine.state.dtype, engine.state.model_config.vocab_size
    del engine
    free_engine()
    if args.compare:
        prompt_sets = [latency_prompts(args.seed, b, args.input_len, vocab) for b in args.batch_sizes]
        hf_compare.compare_latency(report["results"], model_dir, dtype, device, prompt_sets, args.output_len)
    return write_report(report, args, format_table(report), plots.plot_latency)
