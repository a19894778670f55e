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
import json
import math
import random
import statistics
import struct
import time
from pathlib import Path

import torch

from graphllm.bench import hf_compare, plots, profiling
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
    p.add_argument("--bandwidth-tbs", type=float, help="memory bandwidth in TB/s for the ceiling (default: measured)")
    p.set_defaults(func=main)
    return p


def latency_prompts(seed: int, batch_size: int, input_len: int, vocab: int) -> list[list[int]]:
    rng = random.Random(f"{seed}:latency:{batch_size}")  # str seeds are stable across processes
    return [random_prompt(rng, input_len, vocab) for _ in range(batch_size)]


def safetensors_entries(model_dir: Path) -> dict[str, dict]:
    """Tensor name -> {"dtype", "shape"} from the headers of every *.safetensors file (no data read)."""
    entries = {}
    for file in sorted(model_dir.glob("*.safetensors")):
        with open(file, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        entries.update({k: v for k, v in header.items() if k != "__metadata__"})
    return entries


SAFETENSORS_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                     "F8_E4M3": 1, "F8_E5M2": 1, "BOOL": 1}


def decode_weight_bytes(model_dir: Path, dtype: torch.dtype | None) -> dict:
    """Bytes one decode step reads from the weights: at `dtype` (a model folder the engine casts),
    or as stored (None: an artifact's weights.safetensors, quantized tensors at their own width).

    The input embedding is a gather of B rows, not a read of the matrix; tied embeddings (no
    lm_head.weight in the folder) are read whole by the LM head, so they count. A mixture-of-experts
    model's token reads only the experts it routes to: expert tensors (".experts." in the name, stacked
    or one per expert) count at num_experts_per_tok / num_experts (n_routed_experts: DeepSeek), the bytes of one
    sequence's step; DeepSeek's shared experts (".shared_experts.") are read whole.
    """
    entries = safetensors_entries(model_dir)
    numel = {name: math.prod(e["shape"]) for name, e in entries.items()}
    size = {name: dtype.itemsize if dtype else SAFETENSORS_BYTES[e["dtype"]] for name, e in entries.items()}
    tied = not any(".lm_head." in f".{name}" for name in entries)
    embed = [name for name in entries if name.endswith("embed_tokens.weight")]
    read = [name for name in entries if tied or name not in embed]
    hf = json.loads((model_dir / "config.json").read_text())
    experts = hf.get("num_experts") or hf.get("num_local_experts") or hf.get("n_routed_experts")  # DeepSeek's name
    routed = hf["num_experts_per_tok"] / experts if experts else 1.0
    share = {name: routed if ".experts." in name else 1.0 for name in read}
    return {"parameters": sum(numel.values()), "decode_read_parameters": round(sum(numel[n] * share[n] for n in read)),
            "tied_embeddings": tied, "routed_expert_share": routed if experts else None,
            "decode_read_bytes": round(sum(numel[n] * size[n] * share[n] for n in read))}


def measure_bandwidth_tbs(device: torch.device, gib: float = 1.0, reps: int = 20) -> float:
    """Median device-to-device copy bandwidth, read + write counted, in TB/s."""
    n = int(gib * 2**30)
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm-up
    seconds = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        seconds.append(start.elapsed_time(end) / 1e3)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * n / statistics.median(seconds) / 1e12


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


def bandwidth(args: argparse.Namespace, device: torch.device) -> dict:
    """{"bandwidth_tbs", "source"}: the flag, else measured on a GPU, else None."""
    if args.bandwidth_tbs:
        return {"bandwidth_tbs": args.bandwidth_tbs, "source": "--bandwidth-tbs"}
    if device.type == "cuda":
        return {"bandwidth_tbs": measure_bandwidth_tbs(device),
                "source": "measured: 1 GiB device-to-device copy, read + write, median of 20"}
    return {"bandwidth_tbs": None, "source": "not measured on CPU"}


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
    compiled = (engine.state.model_path / "weights.safetensors").is_file()  # an artifact: weights as stored
    weights = report["weights"] = (decode_weight_bytes(engine.state.model_path, None) if compiled
                                   else decode_weight_bytes(model_dir, engine.state.dtype))
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
