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

from graphllm.config import DEFAULT_CUDAGRAPH_MODE

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
called = time.time()  # the process, Python and the imports (torch, graphllm) before it
engine = Engine.load(sys.argv[1], max_model_len=int(sys.argv[3]), cudagraph_mode=sys.argv[4])
loaded = time.time()
engine.generate([[1] * 128], SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
first = time.time()
runners = [r for r in (engine.runner.graphs, engine.runner.mixed_graphs) if r is not None]  # one shared pool
print(json.dumps({"to_first_token_s": first - start, "load_s": loaded - start, "imports_s": called - start,
                  "load_call_to_first_token_s": first - called,
                  "graph_capture_s": sum(r.capture_seconds for r in runners) if runners else None,
                  "graph_pool_gib": sum(r.pool_bytes for r in runners) / 2**30 if runners else None,
                  "mixed_graph_capture_s": engine.runner.mixed_graphs and engine.runner.mixed_graphs.capture_seconds,
                  "startup": engine.state.startup_seconds}))
"""


def evict(art: Path) -> bool:
    """Drop the artifact's files from the page cache (posix_fadvise DONTNEED: no root needed); whether it could."""
    if not hasattr(os, "posix_fadvise"):
        return False
    for path in (p for p in art.rglob("*") if p.is_file()):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return True


def disk_read_gb_s(path: Path) -> float:
    """GB/s of reading the file after evicting it, in weights_io's pieces on its thread pool (no hashing)."""
    from concurrent.futures import ThreadPoolExecutor
    from graphllm.compiler.weights_io import CHUNK_BYTES, _pread_all, chunk_spans, io_workers
    evict(path.parent)
    fd = os.open(path, os.O_RDONLY)
    start = time.perf_counter()
    try:
        def read(span):
            _pread_all(fd, memoryview(bytearray(span[1] - span[0])), span[0])

        with ThreadPoolExecutor(io_workers()) as pool:
            list(pool.map(read, chunk_spans(os.fstat(fd).st_size, CHUNK_BYTES)))
    finally:
        os.close(fd)
    return path.stat().st_size / (time.perf_counter() - start) / 1e9


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
                  max_num_seqs: int, quantization: str | None = None, decode: bool = True,
                  cudagraph_mode: str = DEFAULT_CUDAGRAPH_MODE) -> dict:
    """A quantized model has no eager mode (quantization is a compiler pass): its decode rows are the
    compiled modes only. Warm start runs twice (the page cache holds the artifact: compile wrote it), then
    once more after evicting the artifact from the page cache (cold disk)."""
    max_model_len = input_len + output_len + 16
    art = work / f"artifact-{quantization or 'none'}"
    results = {"cold_compile": cold_compile(model, art, work, max_num_seqs, max_model_len, quantization)}
    print("cold compile:", json.dumps(results["cold_compile"]), flush=True)
    results["warm_start"] = run_python(WARM_START, art, time.time(), max_model_len, cudagraph_mode)
    print("warm start:", json.dumps(results["warm_start"]), flush=True)
    results["warm_start_again"] = run_python(WARM_START, art, time.time(), max_model_len, cudagraph_mode)
    print("warm start again:", json.dumps(results["warm_start_again"]), flush=True)
    if evict(art):  # the cold-disk figure, and the disk's read bandwidth to judge it by
        results["cold_disk_start"] = run_python(WARM_START, art, time.time(), max_model_len, cudagraph_mode)
        results["disk_read_gb_s"] = disk_read_gb_s(art / "weights.safetensors")
        print("cold-disk start:", json.dumps(results["cold_disk_start"]), "disk read:",
              f"{results['disk_read_gb_s']:.2f} GB/s", flush=True)
    results["decode"] = []
    for b in batch_sizes if decode else ():
        for mode in ("graphs", "compiled") + (() if quantization else ("eager",)):
            path = model if mode == "eager" else art
            results["decode"].append(run_python(DECODE, mode, path, b, input_len, output_len, max_model_len))
            print("decode:", json.dumps(results["decode"][-1]), flush=True)
    return results


def format_results(results: dict) -> str:
    cold = results["cold_compile"]
    lines = [f"cold compile: {cold['wall_s']:.1f} s wall ({', '.join(f'{k} {v:.1f}s' for k, v in cold['phases'].items())})"]
    for key, what in (("warm_start", "warm start"), ("warm_start_again", "warm start, again"),
                      ("cold_disk_start", "cold-disk start")):
        if key in results:
            r = results[key]
            phases = ", ".join(f"{k} {v:.2f}" for k, v in (r.get("startup") or {}).items())
            lines.append(f"{what} to first token: {r['to_first_token_s']:.1f} s from the process's start, "
                         f"{r['load_call_to_first_token_s']:.1f} s from the Engine.load call (imports "
                         f"{r['imports_s']:.1f} s; Engine.load returned at {r['load_s']:.1f} s; phases: {phases}; "
                         f"graphs hold {r['graph_pool_gib'] or 0:.3f} GiB)")
    if "disk_read_gb_s" in results:
        lines.append(f"disk read bandwidth (weights file, evicted, parallel reads): {results['disk_read_gb_s']:.2f} GB/s")
    lines.append(f"{'mode':<10} {'batch':>5} {'tok/s/seq':>10} {'tok/s':>10}")
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
                            args.quantization, decode=not args.no_decode, cudagraph_mode=args.cudagraph_mode)
    results["args"] = {k: v for k, v in vars(args).items() if k != "func"}
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    print(format_results(results))
    return 0
