"""`graphllm bench compile`: what compiling buys, measured side by side in one run.

1. cold `graphllm compile` in a fresh process with an empty Inductor cache (wall time);
2. warm start: a fresh process from interpreter start to `Engine.load(artifact)` and the first
   generated token (with the CUDA-graph capture time and the memory the graphs hold);
3. decode speed at each batch size for eager, compiled, and compiled + CUDA graphs, each mode
   in its own process so memory and caches do not leak between them.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

DECODE = """
import json, sys, time, torch
from graphllm import Engine, SamplingParams
mode, path, batch, input_len, output_len, max_model_len = sys.argv[1:7]
batch, input_len, output_len = int(batch), int(input_len), int(output_len)
opts = dict(max_model_len=int(max_model_len), cuda_graphs=mode == "graphs")
engine = Engine.from_pretrained(path, **opts) if mode == "eager" else Engine.load(path, **opts)
params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
gen = torch.Generator().manual_seed(0)
vocab = engine.state.model_config.vocab_size
engine.generate([torch.randint(0, vocab, (input_len,), generator=gen).tolist()], SamplingParams(max_tokens=8))
prompts = [torch.randint(0, vocab, (input_len,), generator=gen).tolist() for _ in range(batch)]
for p in prompts:
    engine.add_request(p, params)
sync = torch.cuda.synchronize if engine.state.device.type == "cuda" else (lambda: None)
engine.step(); sync(); start = time.perf_counter(); steps = 0
while engine.has_unfinished_requests():
    engine.step(); steps += 1
sync(); seconds = time.perf_counter() - start
graphs = engine.runner.graphs
print(json.dumps({"mode": mode, "batch": batch, "decode_steps": steps, "seconds": seconds,
                  "tok_s_per_seq": steps / seconds, "tok_s": batch * steps / seconds,
                  "graph_pool_gib": graphs.pool_bytes / 2**30 if graphs else None,
                  "graph_capture_s": graphs.capture_seconds if graphs else None}))
"""

WARM_START = """
import json, sys, time
start = float(sys.argv[2])
from graphllm import Engine, SamplingParams
engine = Engine.load(sys.argv[1], max_model_len=int(sys.argv[3]))
loaded = time.time()
engine.generate([[1] * 128], SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
first = time.time()
graphs = engine.runner.graphs
print(json.dumps({"to_first_token_s": first - start, "load_s": loaded - start,
                  "graph_capture_s": graphs.capture_seconds if graphs else None,
                  "graph_pool_gib": graphs.pool_bytes / 2**30 if graphs else None}))
"""


def run_python(code: str, *args, env: dict | None = None) -> dict:
    result = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                            env={**os.environ, **(env or {})})
    if result.returncode != 0:
        raise RuntimeError(f"benchmark subprocess failed:\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def cold_compile(model: Path, art: Path, work: Path, max_num_seqs: int, max_model_len: int,
                 quantization: str | None = None) -> dict:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(work / f"inductor-cold-{quantization or 'none'}")}
    start = time.time()
    result = subprocess.run([sys.executable, "-m", "graphllm.cli", "compile", "--model", str(model), "--out",
                             str(art), "--max-num-seqs", str(max_num_seqs), "--max-model-len", str(max_model_len),
                             *(["--quantization", quantization] if quantization else [])],
                            capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise RuntimeError(f"compile failed:\n{result.stderr[-4000:]}")
    manifest = json.loads((art / "manifest.json").read_text())
    return {"wall_s": time.time() - start, "phases": manifest["timings"]}


def bench_compile(model: Path, work: Path, batch_sizes: list[int], input_len: int, output_len: int,
                  max_num_seqs: int, quantization: str | None = None) -> dict:
    """A quantized model has no eager mode (quantization is a compiler pass): its decode rows are the
    compiled modes only."""
    max_model_len = input_len + output_len + 16
    art = work / f"artifact-{quantization or 'none'}"
    results = {"cold_compile": cold_compile(model, art, work, max_num_seqs, max_model_len, quantization)}
    print("cold compile:", json.dumps(results["cold_compile"]), flush=True)
    results["warm_start"] = run_python(WARM_START, art, time.time(), max_model_len)
    print("warm start:", json.dumps(results["warm_start"]), flush=True)
    results["decode"] = []
    for b in batch_sizes:
        for mode in ("graphs", "compiled") + (() if quantization else ("eager",)):
            path = model if mode == "eager" else art
            results["decode"].append(run_python(DECODE, mode, path, b, input_len, output_len, max_model_len))
            print("decode:", json.dumps(results["decode"][-1]), flush=True)
    return results


def format_results(results: dict) -> str:
    cold, warm = results["cold_compile"], results["warm_start"]
    lines = [f"cold compile: {cold['wall_s']:.1f} s wall ({', '.join(f'{k} {v:.1f}s' for k, v in cold['phases'].items())})",
             f"warm start to first token: {warm['to_first_token_s']:.1f} s (load {warm['load_s']:.1f} s, "
             f"graph capture {warm['graph_capture_s'] or 0:.2f} s, graphs hold {warm['graph_pool_gib'] or 0:.3f} GiB)",
             f"{'mode':<10} {'batch':>5} {'tok/s/seq':>10} {'tok/s':>10}"]
    for r in results["decode"]:
        lines.append(f"{r['mode']:<10} {r['batch']:>5} {r['tok_s_per_seq']:>10.1f} {r['tok_s']:>10.1f}")
    return "\n".join(lines)


def main(args) -> int:
    from graphllm.bench.presets import write_preset
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    start = time.time()
    model = Path(args.model) if args.model else write_preset(args.preset, work / "model")
    print(f"model folder ready in {time.time() - start:.1f} s", flush=True)
    results = bench_compile(model, work, args.batch_sizes, args.input_len, args.output_len, args.max_num_seqs,
                            args.quantization)
    results["args"] = {k: v for k, v in vars(args).items() if k != "func"}
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    print(format_results(results))
    return 0
