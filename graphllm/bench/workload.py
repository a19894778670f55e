"""What `bench latency` and `bench throughput` share: flags, model folder, engine, workload, step timing.

The workload is synthetic and seeded: prompts are random token ids in [0, vocab), every request
asks for exactly its output length (`ignore_eos`, greedy). Step timing wraps the engine
instance's own bound methods (nothing in the runtime changes), so a step splits into
schedule / prepare+model / sample / rest.
"""

import argparse
import dataclasses
import gc
import json
import math
import platform
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from graphllm.cli.args import add_pass_flags, add_runtime_flags, memory_options, pass_switches
from graphllm.config import ATTENTION_BACKENDS, DEFAULT_LIMITS, DTYPES, EngineConfig
from graphllm.runtime.sampling_params import SamplingParams
from graphllm.runtime.structured_output import StructuredOutputsParams

PARTS = ("schedule", "model", "sample", "rest")  # a step's time, in this order
# Smallest derived limits: capture's example step (graphllm/ir/capture.py) has 3 sequences and 9
# tokens, so a compiled step cannot be exported for fewer (e.g. --batch-sizes 1 alone).
MIN_MAX_NUM_SEQS, MIN_MAX_NUM_BATCHED_TOKENS = 4, 16


@dataclass(frozen=True)
class BenchRequest:
    prompt: list[int]  # token ids
    output_len: int  # tokens asked for, with ignore_eos
    structured: bool = False  # its output must match STRUCTURED_SCHEMA (bench throughput --structured-fraction)


# the JSON schema of --structured-fraction's requests: an array of objects (bounded integers, strings,
# enums, nested arrays) with more items required than any output holds, so a constrained request
# generates its full output_len like the others and the two runs are one workload
STRUCTURED_SCHEMA = {"type": "array", "minItems": 1000, "items": {
    "type": "object", "required": ["id", "name", "kind"], "additionalProperties": False, "properties": {
        "id": {"type": "integer", "minimum": 0, "maximum": 100000}, "name": {"type": "string"},
        "kind": {"enum": ["alpha", "beta", "gamma"]}, "tags": {"type": "array", "items": {"type": "string"}}}}}


def add_common_args(p: argparse.ArgumentParser, max_num_seqs: int | None) -> None:
    """Flags of both benchmarks; `max_num_seqs` None: derived from the workload."""
    p.add_argument("--preset", default="llama-3-8b", help="random-weight model at real shapes (no download)")
    p.add_argument("--model", help="a Hugging Face model folder instead of a preset")
    p.add_argument("--preset-layers", type=int, help="the preset with this many decoder layers (its shapes, fewer "
                   "layers: for a model whose weights would not fit the disk twice, preset and artifact)")
    p.add_argument("--work", default="bench-work", help="scratch directory: preset folders, artifact cache")
    p.add_argument("--attention-backend", default="auto", choices=ATTENTION_BACKENDS)
    p.add_argument("--eager", action="store_true", help="run the model uncompiled (default: compiled)")
    p.add_argument("--no-cuda-graphs", action="store_true", help="do not replay decode steps from CUDA graphs")
    p.add_argument("--num-decode-steps", type=int, default=1,
                   help="greedy decode steps run back to back per schedule, one host sync for all")
    add_runtime_flags(p)
    add_pass_flags(p)
    p.add_argument("--max-num-seqs", type=int, default=max_num_seqs)
    p.add_argument("--max-model-len", type=int, help="default: the longest request, rounded up to whole KV blocks")
    p.add_argument("--max-num-batched-tokens", type=int, help="token budget of one step")
    p.add_argument("--block-size", type=int, help="tokens per KV-cache block (default 16)")
    p.add_argument("--dtype", default="auto", choices=DTYPES)
    p.add_argument("--device", default="auto")
    p.add_argument("--seed", type=int, default=0, help="seeds prompts (and lengths)")
    p.add_argument("--json", help="write every result here")
    p.add_argument("--plot", help="write a PNG plot here")
    p.add_argument("--compare", choices=["transformers"], help="run the same workload through transformers")
    p.add_argument("--profile", metavar="DIR", help="profile a prefill and a few decode steps; trace + kernel table")
    p.add_argument("--profile-steps", type=int, default=5, help="decode steps under the profiler")


def prepare_work(args: argparse.Namespace) -> Path:
    """The scratch directory (made if missing)."""
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    return work


def cache_dir(args: argparse.Namespace, work: Path) -> str:
    """Where the engine's artifacts go: GRAPHLLM_CACHE_DIR (read by the CLI entry), else <work>/cache."""
    return getattr(args, "cache_dir", None) or str((work / "cache").resolve())


def model_folder(args: argparse.Namespace, work: Path, echo: bool = False) -> Path:
    """--model, else the preset's folder under --work (written once, in a staging directory of its own renamed
    into place when complete; a bench started beside one writing it waits for it, as compiles of one artifact do:
    compiler/staging.py); echo: presets.random_weights' (a folder of its own)."""
    if args.model:
        return Path(args.model).expanduser()
    from graphllm.bench.presets import write_preset
    from graphllm.compiler.staging import exclusive, publish, staging_dir
    layers = getattr(args, "preset_layers", None)
    folder = work / "models" / (args.preset + (f"-{layers}-layers" if layers else "")
                                + ("-echo" if echo else ""))
    if (folder / "config.json").is_file():
        return folder
    with exclusive(folder.with_name(folder.name + ".lock"), f"another bench is writing {folder}; waiting for it", True):
        if not (folder / "config.json").is_file():
            start = time.perf_counter()
            overrides = {"num_hidden_layers": layers} if layers else {}
            staging = staging_dir(folder)
            try:
                write_preset(args.preset, staging, overrides=overrides, echo=echo)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
            publish(staging, folder)
            print(f"wrote preset {args.preset} to {folder} in {time.perf_counter() - start:.1f} s", flush=True)
    return folder


def build_engine(args: argparse.Namespace, model_dir: Path, max_num_seqs: int, max_model_len: int,
                 max_num_batched_tokens: int):
    """The engine under test: flags first, else the limits the workload needs."""
    from graphllm.runtime.engine import Engine
    max_num_seqs = args.max_num_seqs or max(max_num_seqs, MIN_MAX_NUM_SEQS)
    tokens = max(max_num_batched_tokens, max_num_seqs, MIN_MAX_NUM_BATCHED_TOKENS)
    config = EngineConfig(
        model=str(model_dir), compile=not args.eager, dtype=args.dtype, device=args.device,
        max_num_seqs=max_num_seqs,
        max_model_len=args.max_model_len or whole_blocks(model_dir, max_model_len, args.block_size),
        max_num_batched_tokens=args.max_num_batched_tokens or tokens, block_size=args.block_size,
        **memory_options(args), cuda_graphs=not args.no_cuda_graphs,
        attention_backend=args.attention_backend, num_decode_steps=args.num_decode_steps,
        async_scheduling=args.async_scheduling, kv_cache_dtype=args.kv_cache_dtype,
        calculate_kv_scales=args.calculate_kv_scales, enable_prefix_caching=args.enable_prefix_caching,
        enable_pdl=args.enable_pdl, fuse_rope_decode=args.fuse_rope_decode, xqa_decode=args.xqa_decode,
        xqa_mixed=args.xqa_mixed,
        cudagraph_mode=args.cudagraph_mode,
        max_cudagraph_capture_size=args.max_cudagraph_capture_size, speculative_config=args.speculative_config,
        cache_dir=cache_dir(args, Path(args.work)), **pass_switches(args))
    start = time.perf_counter()
    engine = Engine(config)
    print(f"engine ready in {time.perf_counter() - start:.1f} s ({'eager' if args.eager else 'compiled'}, "
          f"{'CUDA graphs' if engine.runner.graphs else 'no CUDA graphs'})", flush=True)
    return engine


def model_dtype(args: argparse.Namespace, model_dir: Path, device: torch.device) -> torch.dtype:
    """The dtype the engine will run model_dir in (--dtype, resolved as the engine resolves it)."""
    from graphllm.device import resolve_dtype
    return resolve_dtype(args.dtype, json.loads((model_dir / "config.json").read_text()), device)


def whole_blocks(model_dir: Path, tokens: int, block: int | None = None) -> int:
    """`tokens` rounded up to whole KV blocks of `block` tokens (None: the default size), within the model's
    positions: the engine sizes its cache as max_num_seqs * max_model_len tokens, so every sequence then gets its
    blocks at once."""
    block = block or DEFAULT_LIMITS["block_size"]
    config = model_dir / "config.json"  # missing: the engine says so
    limit = json.loads(config.read_text()).get("max_position_embeddings") if config.is_file() else None
    limit = limit or tokens
    return max(tokens, min(-(-tokens // block) * block, limit))


def engine_facts(engine) -> dict:
    state, graphs = engine.state, engine.runner.graphs
    backend = getattr(engine.runner, "backend", None)  # the runner's resolved backend, where it keeps one
    return {"model": str(state.model_path), "device": device_name(state.device), "dtype": str(state.dtype)[6:],
            "compiled": engine.model is None, "cuda_graphs": graphs is not None,
            "attention_backend": getattr(backend, "name", None) or engine.config.attention_backend,
            "max_num_seqs": state.limits.max_num_seqs, "max_num_batched_tokens": state.limits.max_num_batched_tokens,
            "max_model_len": state.max_model_len, "num_kv_blocks": state.num_kv_blocks,
            "kv_cache_gib": state.kv_cache_bytes / 2**30, "kv_cache_dtype": str(state.kv_cache_dtype)[6:],
            "async_scheduling": engine.async_scheduling,
            "spec_decode": (dataclasses.asdict(engine.spec_decoder.stats.snapshot()) if engine.spec_decoder is not None
                            else None)}


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{device.type} ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def synchronizer(device: torch.device):
    return (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)


def random_prompt(rng: random.Random, length: int, vocab: int) -> list[int]:
    return [rng.randrange(vocab) for _ in range(length)]


def make_requests(num: int, min_len: int, max_len: int, vocab: int, seed: int) -> list[BenchRequest]:
    """Input and output lengths uniform in [min_len, max_len], drawn independently; one rng for all."""
    if not 1 <= min_len <= max_len:
        raise ValueError(f"need 1 <= --min-len <= --max-len, got {min_len} and {max_len}")
    rng = random.Random(seed)
    input_lens = [rng.randint(min_len, max_len) for _ in range(num)]
    output_lens = [rng.randint(min_len, max_len) for _ in range(num)]
    return [BenchRequest(random_prompt(rng, i, vocab), o) for i, o in zip(input_lens, output_lens)]


def synthetic_vocabulary(size: int, seed: int = 0) -> list[str]:
    """size distinct token texts for a preset without a tokenizer, shaped like a BPE vocabulary for the
    grammar engine's cost: the printable ASCII characters, then (seeded) 85% lowercase or capitalised
    words of 2-9 letters, most with a leading space, 8% numbers of 1-3 digits, 7% runs of code and JSON
    punctuation. Not a language: a random vocabulary of mixed punctuation and letters made xgrammar's
    masks 100x slower inside strings than this shape does (measured on the CPU)."""
    rng = random.Random(f"vocabulary:{seed}")
    alphabet = [chr(c) for c in range(32, 127)] + ["\n", "\t"]
    punctuation = ['"', '",', '":', "{", "}", "},", "[", "]", "],", ", ", ".", ". ", ":", ";", "(", ")", "();", "=",
                   "==", "->", "//", "#", '"}', '":"', "\n", "\n\n", "  ", "    "]
    vocab, seen = list(alphabet), set(alphabet)
    while len(vocab) < size:
        kind = rng.random()
        if kind < 0.85:
            text = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
            text = text.capitalize() if rng.random() < 0.3 else text
            text = " " + text if rng.random() < 0.6 else text
        elif kind < 0.93:
            text = (" " if rng.random() < 0.5 else "") + "".join(rng.choice("0123456789")
                                                                   for _ in range(rng.randint(1, 3)))
        else:
            text = "".join(rng.choice(punctuation) for _ in range(rng.randint(1, 3)))
        if text not in seen:
            seen.add(text)
            vocab.append(text)
    return vocab


def params_for(output_len: int, structured: bool = False) -> SamplingParams:
    """Greedy, exactly output_len tokens (ignore_eos); structured: STRUCTURED_SCHEMA constrains them."""
    return SamplingParams(max_tokens=output_len, ignore_eos=True, temperature=0.0,
                          structured_outputs=StructuredOutputsParams(json=STRUCTURED_SCHEMA) if structured else None)


def summarize_run(requests: list[BenchRequest], generated: list[int], wall: float) -> dict:
    """Rates of one throughput run; `generated` is the useful output tokens of each request."""
    inputs, outputs = sum(len(r.prompt) for r in requests), sum(generated)
    return {"num_requests": len(requests), "wall_s": wall, "input_tokens": inputs, "output_tokens": outputs,
            "output_tok_s": outputs / wall, "total_tok_s": (inputs + outputs) / wall,
            "requests_s": len(requests) / wall, "generated_tokens": generated}


def warm_up(engine, num_seqs: int, input_len: int) -> None:
    """One short generate: first-call costs (allocator, kernel caches) stay out of the measurements."""
    vocab = engine.state.model_config.vocab_size
    rng = random.Random("warm-up")
    input_len = max(1, min(input_len, engine.state.max_model_len - 4))
    engine.generate([random_prompt(rng, input_len, vocab) for _ in range(num_seqs)], params_for(4))


class _TimedSampler:
    """The engine's sampler with both entry points timed as "sample"."""

    def __init__(self, sampler, timed):
        self.sampler, self._call = sampler, timed(sampler)
        self.sample_on_device = timed(sampler.sample_on_device)

    def __call__(self, *args, **kwargs):
        return self._call(*args, **kwargs)


def _stream_event():
    """A timing event recorded now on the current CUDA stream (the engine's)."""
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


class StepTimer:
    """Times every engine step and its parts by wrapping the instance's bound methods.

    A step is "prefill" if it computes any prompt token, else "decode". Without async scheduling
    the model call is followed by a device sync, so its GPU time lands in "model" (the sampler
    would wait for it anyway). With it, each step call launches one step and reads back the one
    before: "model" is the host's launch, and the GPU time lands in "sample", which then includes
    the wait for the previous step's tokens. A step's host total then holds the GPU time of the step before it,
    so on CUDA each step also ends with an event on the stream: "gpu" is the GPU timeline from the end of the
    step before to the end of this one (the step's kernels and any idle gap before them), which attributes a
    long prompt step's time to that step, not to the decode step after it (2026-12-06: under async scheduling the
    host totals put ~5 ms of each mixed step into the next step).
    """

    def __init__(self, engine):
        self.engine, self.sync = engine, synchronizer(engine.state.device)
        self.records: list[tuple[str, dict[str, float]]] = []  # (phase, seconds per part)
        # one event before the first step, then one after each step's launches (CUDA only)
        self._events: list | None = [] if engine.state.device.type == "cuda" else None
        self._parts: dict[str, float] = {}
        self._phase, self._shape = "decode", {}
        self._originals = (engine.step, engine.scheduler.schedule, engine.runner.execute, engine.sampler)
        step, schedule, execute, sampler = self._originals
        engine.step = self._wrap_step(step)
        engine.scheduler.schedule = self._wrap_schedule(schedule)
        overlapped = engine.async_scheduling
        engine.runner.execute = self._timed("model", execute, sync=not overlapped)
        engine.runner.execute_decode_steps = self._timed("model", engine.runner.execute_decode_steps, sync=True)
        engine.sampler = _TimedSampler(sampler, lambda fn: self._timed("sample", fn, sync=False))
        engine.step_loop._wait_for_tokens = self._timed("sample", engine.step_loop._wait_for_tokens, sync=False)

    def remove(self) -> None:
        """Put the engine back as it was."""
        del self.engine.step, self.engine.scheduler.schedule, self.engine.runner.execute
        del self.engine.runner.execute_decode_steps, self.engine.step_loop._wait_for_tokens
        self.engine.sampler = self._originals[3]

    def _timed(self, part: str, fn, sync: bool):
        def timed(*a, **kw):
            start = time.perf_counter()
            out = fn(*a, **kw)
            if sync:
                self.sync()
            self._parts[part] = self._parts.get(part, 0.0) + time.perf_counter() - start
            return out
        return timed

    def _wrap_schedule(self, schedule):
        timed = self._timed("schedule", schedule, sync=False)

        def wrapped():
            batch = timed()
            prefill = [s for s in batch if s.seq.num_computed_tokens < s.seq.num_prompt_tokens]
            self._phase = "prefill" if prefill else "decode"
            self._shape = {"seqs": len(batch), "prefill_tokens": sum(s.num_new_tokens for s in prefill),
                           "decode_seqs": len(batch) - len(prefill),
                           "new_tokens": sum(s.num_new_tokens for s in batch),
                           "context_tokens": sum(s.seq.num_computed_tokens + s.num_new_tokens for s in batch)}
            return batch
        return wrapped

    def _wrap_step(self, step):
        def wrapped():
            self._parts = {}
            if self._events == []:
                self._events.append(_stream_event())
            start = time.perf_counter()
            out = step()
            total = time.perf_counter() - start
            if "model" in self._parts:  # an empty schedule ran nothing: not a step
                parts = {p: self._parts.get(p, 0.0) for p in PARTS[:3]}
                self.records.append((self._phase, {**parts, "rest": total - sum(parts.values()), "total": total,
                                                   **self._shape}))
                if self._events is not None:
                    self._events.append(_stream_event())
            return out
        return wrapped

    def gpu_seconds(self) -> list[float] | None:
        """Each step's span of the GPU timeline (the class docstring); None off CUDA. Waits for the last step's
        kernels (under async scheduling the last call may have launched a step nobody waited for)."""
        if not self._events:
            return None
        self._events[-1].synchronize()
        return [a.elapsed_time(b) / 1e3 for a, b in zip(self._events, self._events[1:])]

    def step_table(self) -> dict[str, list]:
        """Every step as a column table: batch shape (sequences, prompt tokens computed, decoding sequences,
        tokens computed, tokens of context after the step) and milliseconds (model call, whole step), for
        offline analysis and roofline.schedule_floor."""
        keys = ("seqs", "prefill_tokens", "decode_seqs", "new_tokens", "context_tokens")
        table = {k: [r.get(k) for _, r in self.records] for k in keys}
        for part in ("model", "total"):
            table[f"{part}_ms"] = [round(1e3 * r[part], 3) for _, r in self.records]
        if (gpu := self.gpu_seconds()) is not None:
            table["gpu_ms"] = [round(1e3 * t, 3) for t in gpu]
        return table

    def reset(self) -> None:
        self.records = []
        self._events = None if self._events is None else []

    def summary(self) -> dict[str, dict]:
        """Per phase: steps, the mean milliseconds of each part and of the whole step, and the whole step's
        median and 99th percentile (nearest rank), so a slow tail shows beside a good mean."""
        out, gpu = {}, self.gpu_seconds()
        for phase in ("prefill", "decode"):
            recs = [r for p, r in self.records if p == phase]
            if recs:
                totals = sorted(1e3 * r["total"] for r in recs)
                out[phase] = {"steps": len(recs), **{f"{k}_ms": 1e3 * sum(r[k] for r in recs) / len(recs)
                                                      for k in (*PARTS, "total")},
                              "p50_ms": percentile(totals, 50), "p99_ms": percentile(totals, 99)}
                if gpu is not None:  # the mean span of the GPU timeline (gpu_seconds)
                    spans = [t for (p, _), t in zip(self.records, gpu) if p == phase]
                    out[phase]["gpu_ms"] = 1e3 * sum(spans) / len(spans)
        return out


def percentile(ordered: list[float], q: float) -> float:
    """The nearest-rank q-th percentile of an ascending list."""
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def free_engine() -> None:
    """After the caller dropped its last reference to an engine: give its memory back."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def write_report(report: dict, args: argparse.Namespace, table: str, plot) -> int:
    """The end of a bench command: print its table, write --json, draw --plot with plot(report, path)."""
    print(table)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1))
        print(f"wrote {args.json}")
    if args.plot:
        plot(report, args.plot)
        print(f"wrote {args.plot}")
    return 0


def format_rows(rows: list[tuple], left: int = 0) -> str:
    """Aligned columns, the first `left` of them to the left, the rest to the right; row 0 is the header."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    return "\n".join("  ".join(c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
                     for row in cells)


def fmt(value, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)
