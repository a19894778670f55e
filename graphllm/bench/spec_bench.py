"""`graphllm bench spec`: what speculative decoding's mechanism buys, with an oracle proposer (issue 21).

Random weights propose nothing useful, so the proposals come from spec_decode/oracle.py: for each batch
size B, B prompts are first decoded without proposals (the plain run: its greedy continuations become the
oracle's references, its decode speed the baseline), then once per k (--num-speculative-tokens) and
acceptance rate (--acceptance-rates) with the oracle proposing from the references. One engine serves all
runs (speculative_config {"method": "oracle", k = the largest}); being speculative it runs its steps
synchronously, and its verify steps (k + 1 query tokens per sequence) without CUDA graphs, while steps
without proposals replay them. Reported per run: decode tok/s and its ratio to the plain run, the mean
decode-phase step (a verify step in a speculative run) and its ratio to a plain decode step, the measured
acceptance rate and mean accepted length. Every speculative run must generate the plain run's tokens
(greedy verification is exact); the benchmark checks that.
"""

import argparse
import dataclasses

from graphllm.bench.latency import latency_prompts
from graphllm.bench.serve_bench import parse_levels
from graphllm.bench.workload import (StepTimer, add_common_args, build_engine, engine_facts, fmt, format_rows,
                                     model_folder, params_for, prepare_work, warm_up, write_report)


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register `spec` under `graphllm bench`."""
    p = subparsers.add_parser("spec", help="speculative decoding with an oracle proposer: verify-step cost, speed-up")
    add_common_args(p, max_num_seqs=None)
    p.add_argument("--batch-sizes", type=parse_levels, default=(1, 8, 32), help="e.g. 1,8,32")
    p.add_argument("--num-speculative-tokens", type=parse_levels, default=(1, 2, 4, 8), help="k values, e.g. 1,2,4,8")
    p.add_argument("--acceptance-rates", type=lambda s: [float(x) for x in s.split(",")], default=[1.0, 0.6],
                   help="shares of proposed tokens the oracle gets right on average, e.g. 1.0,0.6")
    p.add_argument("--input-len", type=int, default=128, help="prompt tokens per sequence")
    p.add_argument("--output-len", type=int, default=128, help="generated tokens per sequence (ignore_eos)")
    p.set_defaults(func=main)
    return p


def run_batch(engine, timer: StepTimer, prompts: list[list[int]], output_len: int) -> tuple[list[list[int]], dict]:
    """Generate for prompts, step-timed: (the tokens of each, {decode seconds, tok/s, mean decode step ms})."""
    timer.reset()
    outs = engine.generate(prompts, params_for(output_len))
    decode = timer.summary().get("decode") or {}
    steps, step_ms = decode.get("steps", 0), decode.get("total_ms", 0.0)
    decode_s = steps * step_ms / 1e3
    tokens = [o.outputs[0].token_ids for o in outs]
    decoded = sum(len(t) - 1 for t in tokens)  # the first token of each comes from the prefill step
    return tokens, {"decode_s": decode_s, "decode_tok_s": decoded / decode_s if decode_s else None,
                    "decode_steps": steps, "step_ms": step_ms}


def measure(engine, args: argparse.Namespace) -> list[dict]:
    oracle, stats = engine.spec_decoder.proposer, engine.spec_decoder.stats
    timer, rows = StepTimer(engine), []
    try:
        for b in args.batch_sizes:
            prompts = latency_prompts(args.seed, b, args.input_len, engine.state.model_config.vocab_size)
            oracle.references.clear()
            reference, plain = run_batch(engine, timer, prompts, args.output_len)
            rows.append({"batch_size": b, "k": 0, "acceptance_target": None, **plain})
            for prompt, tokens in zip(prompts, reference):
                oracle.expect(prompt, tokens)
            for k in args.num_speculative_tokens:
                for rate in args.acceptance_rates:
                    oracle.num_tokens, oracle.acceptance_rate = k, rate
                    before = dataclasses.replace(stats)
                    tokens, run = run_batch(engine, timer, prompts, args.output_len)
                    if tokens != reference:
                        raise AssertionError(f"batch {b}, k {k}, rate {rate}: speculative tokens differ from plain")
                    drafts, proposed = stats.num_drafts - before.num_drafts, stats.num_draft_tokens - before.num_draft_tokens
                    accepted = stats.num_accepted_tokens - before.num_accepted_tokens
                    rows.append({"batch_size": b, "k": k, "acceptance_target": rate, **run,
                                 "acceptance_rate": accepted / proposed if proposed else None,
                                 "mean_accepted_length": 1 + accepted / drafts if drafts else None,
                                 "speedup": ratio(run["decode_tok_s"], plain["decode_tok_s"]),
                                 "step_ratio": ratio(run["step_ms"], plain["step_ms"])})
                    print(f"batch {b}, k {k}, acceptance {rate}: {fmt(run['decode_tok_s'])} tok/s "
                          f"(x{fmt(rows[-1]['speedup'], '.2f')}), step x{fmt(rows[-1]['step_ratio'], '.2f')}", flush=True)
    finally:
        timer.remove()
    return rows


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def format_table(report: dict) -> str:
    rows = [("batch", "k", "acceptance target / measured", "mean accepted len", "decode tok/s", "vs plain",
             "step ms", "step vs plain decode")]
    for r in report["results"]:
        rate = "plain" if not r["k"] else f"{r['acceptance_target']:.2f} / {fmt(r['acceptance_rate'], '.2f')}"
        rows.append((r["batch_size"], r["k"] or "-", rate, fmt(r.get("mean_accepted_length"), ".2f"),
                     fmt(r["decode_tok_s"]), fmt(r.get("speedup"), ".2f"), f"{r['step_ms']:.2f}",
                     fmt(r.get("step_ratio"), ".2f")))
    return format_rows(rows)


def main(args: argparse.Namespace) -> int:
    work = prepare_work(args)
    model_dir, max_b, max_k = model_folder(args, work), max(args.batch_sizes), max(args.num_speculative_tokens)
    if args.speculative_config is not None:
        raise ValueError("bench spec builds its own speculative_config (the oracle proposer): drop --speculative-config")
    args.speculative_config = {"method": "oracle", "num_speculative_tokens": max_k}
    engine = build_engine(args, model_dir, max_b, args.input_len + args.output_len + max_k + 1,
                          max_b * args.input_len)
    warm_up(engine, max_b, args.input_len)
    report = {"benchmark": "spec", "args": {k: v for k, v in vars(args).items() if k != "func"},
              "engine": engine_facts(engine)}
    report["results"] = measure(engine, args)
    return write_report(report, args, format_table(report), lambda report, path: None)
