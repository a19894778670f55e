"""`graphllm bench spec`: what speculative decoding's mechanism buys, with an oracle proposer (issue 21).

Random weights propose nothing useful, so the proposals come from spec_decode/oracle.py: for each batch
size B, B prompts are first decoded without proposals (the plain run: its greedy continuations become the
oracle's references, its decode speed the baseline), then once per k (--num-speculative-tokens) and
acceptance rate (--acceptance-rates) with the oracle proposing from the references. One engine serves all
runs (speculative_config {"method": "oracle", k = the largest}); being speculative it runs its steps
synchronously. Its verify steps replay the verify CUDA graphs of the fewest tokens a sequence that hold them
(setup.verify_sizes: k = 1, 2, 4, 8 replay graphs of 2, 3, 5, 9), steps without proposals the decode graphs.
Reported per run: decode tok/s and its ratio to the plain run, the mean decode-phase step (a verify step in a
speculative run) and its ratio to a plain decode step, the measured acceptance rate and mean accepted length.
--profile DIR then profiles plain and verify steps of the smallest batch (profile_steps).

The preset is its echo variant (presets.random_weights; --no-echo-preset: the usual one): a model that
repeats its last token by a wide margin. With the other benches' weights the deep random network's bf16
logits nearly tie, and a verify step's kernels rather than a decode step's flip greedy tokens within the
first few to dozen; after a flip the oracle's proposals are wrong (measured on the H200: acceptance 0.00-0.05
where 1.0 was asked). In float32 every speculative run must generate the plain run's tokens (greedy verification is
exact), and the benchmark checks that; in bf16 it reports the share that agrees (check_tokens).

`--method ngram` measures a real proposer instead: vLLM's prompt lookup on a copy-heavy prompt set, the
built-in demo model's held-out arithmetic questions in its chat template (its answers restate the question:
"17 plus 25 is 42."), greedy with EOS honoured (--output-len caps the answer). The demo model unless --model.
A plain engine gives the baseline; one ngram engine per k then runs the same prompts.
"""

import argparse
import dataclasses
from pathlib import Path

import torch

from graphllm.bench import profiling
from graphllm.bench.latency import latency_prompts
from graphllm.bench.serve_bench import parse_levels
from graphllm.bench.workload import (StepTimer, add_common_args, build_engine, engine_facts, fmt, format_rows,
                                     free_engine, model_folder, params_for, prepare_work, warm_up, write_report)
from graphllm.demo import DEMO_MODEL_DIR, chat_messages, held_out_questions
from graphllm.runtime.sampling_params import SamplingParams

MAX_DEMO_PROMPT = 64  # tokens: a demo question in its chat template is about 20-30


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register `spec` under `graphllm bench`."""
    p = subparsers.add_parser("spec", help="speculative decoding with an oracle proposer: verify-step cost, speed-up")
    add_common_args(p, max_num_seqs=None)
    p.add_argument("--batch-sizes", type=parse_levels, default=(1, 8, 32), help="e.g. 1,8,32")
    p.add_argument("--num-speculative-tokens", type=parse_levels, default=(1, 2, 4, 8), help="k values, e.g. 1,2,4,8")
    p.add_argument("--acceptance-rates", type=lambda s: [float(x) for x in s.split(",")], default=[1.0, 0.6],
                   help="shares of proposed tokens the oracle gets right on average, e.g. 1.0,0.6")
    p.add_argument("--input-len", type=int, default=128, help="prompt tokens per sequence")
    p.add_argument("--output-len", type=int, default=128, help="generated tokens per sequence (ignore_eos; "
                   "with --method ngram: at most, EOS ends an answer)")
    p.add_argument("--method", choices=("oracle", "ngram"), default="oracle",
                   help="oracle: proposals right at --acceptance-rates; ngram: prompt lookup on the demo model's "
                        "arithmetic questions (module docstring)")
    p.add_argument("--echo-preset", action=argparse.BooleanOptionalAction, default=True,
                   help="oracle on a preset: its echo variant (presets.random_weights), whose greedy tokens bf16 "
                        "kernel paths agree on; --no-echo-preset: the other benches' preset")
    p.add_argument("--prompt-lookup-max", type=int, default=4, help="ngram: the longest n-gram looked up")
    p.add_argument("--prompt-lookup-min", type=int, default=2, help="ngram: the shortest n-gram looked up")
    p.set_defaults(func=main)
    return p


def run_batch(engine, timer: StepTimer, prompts: list[list[int]], output_len: int,
              params: SamplingParams | None = None) -> tuple[list[list[int]], dict]:
    """Generate for prompts (default params: greedy, exactly output_len tokens), step-timed: (the tokens of
    each, {decode seconds, tok/s, mean decode step ms})."""
    timer.reset()
    outs = engine.generate(prompts, params or params_for(output_len))
    decode = timer.summary().get("decode") or {}
    steps, step_ms = decode.get("steps", 0), decode.get("total_ms", 0.0)
    decode_s = steps * step_ms / 1e3
    tokens = [o.outputs[0].token_ids for o in outs]
    decoded = sum(len(t) - 1 for t in tokens)  # the first token of each comes from the prefill step
    return tokens, {"decode_s": decode_s, "decode_tok_s": decoded / decode_s if decode_s else None,
                    "decode_steps": steps, "step_ms": step_ms}


def warm_up_verify(engine, args: argparse.Namespace) -> None:
    """A few tokens of every batch size and k through the oracle, so first-call costs (kernels compiled for a
    shape, the sampler's paths) stay out of the first measured speculative run."""
    oracle, vocab = engine.spec_decoder.proposer, engine.state.model_config.vocab_size
    for b in args.batch_sizes:
        prompts = latency_prompts(args.seed + 1, b, args.input_len, vocab)
        for prompt, out in zip(prompts, engine.generate(prompts, params_for(12))):
            oracle.expect(prompt, out.outputs[0].token_ids)
        for k in args.num_speculative_tokens:
            oracle.num_tokens, oracle.acceptance_rate = k, 1.0
            engine.generate(prompts, params_for(12))
    oracle.references.clear()


def measure(engine, args: argparse.Namespace) -> list[dict]:
    oracle, stats = engine.spec_decoder.proposer, engine.spec_decoder.stats
    warm_up_verify(engine, args)
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
                    check_tokens(engine, tokens, reference, f"batch {b}, k {k}, rate {rate}", run)
                    rows.append(spec_row(b, k, rate, run, plain, stats, before))
    finally:
        timer.remove()
    return rows


def check_tokens(engine, tokens: list[list[int]], reference: list[list[int]], what: str, run: dict) -> None:
    """Greedy verification is exact in float32: there a speculative run must generate the plain run's tokens.
    In bf16 a verify step's logits differ from a decode step's in the last bits (other kernels, other
    summation orders), and random weights leave near-ties that flip: run["same_tokens"] records the share of
    generated tokens before each sequence's first difference (an oracle proposes the plain tokens, so after one
    its proposals are wrong and measured acceptance falls below the target)."""
    agree = [next((i for i, (x, y) in enumerate(zip(t, r)) if x != y), len(r)) / len(r)
             for t, r in zip(tokens, reference)]
    run["same_tokens"] = sum(agree) / len(agree)
    if tokens != reference and engine.state.dtype == torch.float32:
        raise AssertionError(f"{what}: speculative tokens differ from plain (float32)")


def measure_ngram(args: argparse.Namespace, model_dir: Path) -> tuple[list[dict], dict]:
    """Per batch size: the plain engine's run, then an ngram engine's per k (the tokens must be the same).
    Returns the rows and the plain engine's facts."""
    params = SamplingParams(temperature=0.0, max_tokens=args.output_len)
    questions = [q for q, _ in held_out_questions(max(args.batch_sizes))]
    max_len = MAX_DEMO_PROMPT + args.output_len + max(args.num_speculative_tokens) + 1
    configs = [None] + [{"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": args.prompt_lookup_max,
                         "prompt_lookup_min": args.prompt_lookup_min} for k in args.num_speculative_tokens]
    rows, plain, facts = [], {}, None
    for config in configs:
        engine = build_engine(argparse.Namespace(**{**vars(args), "speculative_config": config}), model_dir,
                              max(args.batch_sizes), max_len, max(args.batch_sizes) * MAX_DEMO_PROMPT)
        facts = facts or engine_facts(engine)
        warm_up(engine, max(args.batch_sizes), 16)
        engine.generate([engine.apply_chat_template(chat_messages(questions[0]))], params)  # verify steps too
        timer, stats = StepTimer(engine), engine.spec_decoder.stats if config else None
        try:
            for b in args.batch_sizes:
                prompts = [engine.apply_chat_template(chat_messages(q)) for q in questions[:b]]
                before = stats.snapshot() if config else None
                tokens, run = run_batch(engine, timer, prompts, args.output_len, params)
                if config is None:
                    plain[b] = (tokens, run)
                    rows.append({"batch_size": b, "k": 0, "acceptance_target": None, **run})
                    continue
                check_tokens(engine, tokens, plain[b][0], f"batch {b}, ngram k {config['num_speculative_tokens']}", run)
                rows.append(spec_row(b, config["num_speculative_tokens"], None, run, plain[b][1], stats, before))
        finally:
            timer.remove()
            del engine
            free_engine()
    return rows, facts


def spec_row(b: int, k: int, rate: float | None, run: dict, plain: dict, stats, before) -> dict:
    """One speculative run's row: its acceptance from the proposer's counters (stats minus before)."""
    drafts, proposed = stats.num_drafts - before.num_drafts, stats.num_draft_tokens - before.num_draft_tokens
    accepted = stats.num_accepted_tokens - before.num_accepted_tokens
    row = {"batch_size": b, "k": k, "acceptance_target": rate, **run,
           "acceptance_rate": accepted / proposed if proposed else None,
           "mean_accepted_length": 1 + accepted / drafts if drafts else None,
           "speedup": ratio(run["decode_tok_s"], plain["decode_tok_s"]),
           "step_ratio": ratio(run["step_ms"], plain["step_ms"])}
    print(f"batch {b}, k {k}, acceptance {rate if rate is not None else 'measured'}: {fmt(run['decode_tok_s'])} "
          f"tok/s (x{fmt(row['speedup'], '.2f')}), step x{fmt(row['step_ratio'], '.2f')}, accepted "
          f"{fmt(row['acceptance_rate'], '.2f')}", flush=True)
    return row


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def format_table(report: dict) -> str:
    rows = [("batch", "k", "acceptance target / measured", "mean accepted len", "decode tok/s", "vs plain",
             "step ms", "step vs plain decode", "same tokens")]
    for r in report["results"]:
        target = "-" if r["acceptance_target"] is None else f"{r['acceptance_target']:.2f}"
        rate = "plain" if not r["k"] else f"{target} / {fmt(r['acceptance_rate'], '.2f')}"
        rows.append((r["batch_size"], r["k"] or "-", rate, fmt(r.get("mean_accepted_length"), ".2f"),
                     fmt(r["decode_tok_s"]), fmt(r.get("speedup"), ".2f"), f"{r['step_ms']:.2f}",
                     fmt(r.get("step_ratio"), ".2f"), fmt(r.get("same_tokens"), ".2f")))
    return format_rows(rows)


def main(args: argparse.Namespace) -> int:
    work = prepare_work(args)
    if args.speculative_config is not None:
        raise ValueError("bench spec builds its own speculative_config (--method): drop --speculative-config")
    if args.method == "ngram":
        if args.profile:
            raise ValueError("bench spec --profile profiles the oracle's verify steps: drop --method ngram")
        model_dir = Path(args.model).expanduser() if args.model else DEMO_MODEL_DIR
        rows, facts = measure_ngram(args, model_dir)
        report = {"benchmark": "spec", "args": {k: v for k, v in vars(args).items() if k != "func"},
                  "engine": facts, "results": rows}
        return write_report(report, args, format_table(report), lambda report, path: None)
    model_dir = model_folder(args, work, echo=args.echo_preset)
    max_b, max_k = max(args.batch_sizes), max(args.num_speculative_tokens)
    args.speculative_config = {"method": "oracle", "num_speculative_tokens": max_k}
    engine = build_engine(args, model_dir, max_b, args.input_len + args.output_len + max_k + 1,
                          max_b * args.input_len)
    warm_up(engine, max_b, args.input_len)
    report = {"benchmark": "spec", "args": {k: v for k, v in vars(args).items() if k != "func"},
              "engine": engine_facts(engine)}
    report["results"] = measure(engine, args)
    if args.profile:
        report["profile"] = profile_steps(engine, args, Path(args.profile))
    return write_report(report, args, format_table(report), lambda report, path: None)


def profile_steps(engine, args: argparse.Namespace, out_dir: Path) -> dict:
    """--profile DIR: the smallest batch's plain decode steps (DIR/plain) and its verify steps at the largest k
    with every proposal right (DIR/verify-kK), --profile-steps of each under torch.profiler (bench/profiling.py:
    trace and kernel table; a verify step is that table's "decode" phase)."""
    oracle, b, k = engine.spec_decoder.proposer, min(args.batch_sizes), max(args.num_speculative_tokens)
    prompts = latency_prompts(args.seed, b, args.input_len, engine.state.model_config.vocab_size)
    steps = args.profile_steps
    oracle.references.clear()
    plain = profiling.profile_engine(engine, prompts, steps, out_dir / "plain")
    print(profiling.format_profile(plain))
    for prompt, out in zip(prompts, engine.generate(prompts, params_for(steps * (k + 1) + 2))):
        oracle.expect(prompt, out.outputs[0].token_ids)
    oracle.num_tokens, oracle.acceptance_rate = k, 1.0
    verify = profiling.profile_engine(engine, prompts, steps * (k + 1), out_dir / f"verify-k{k}")
    print(profiling.format_profile(verify))
    oracle.references.clear()
    return {"batch_size": b, "k": k, "plain": plain, "verify": verify}
