"""`--profile DIR`: a batch's prefill and a few decode steps under torch.profiler; trace + kernel table.

Each step runs inside a `graphllm.bench::prefill` or `graphllm.bench::decode` range and ends with
a device sync, so the device work of a step lies within its range. Writes DIR/trace.json (open
it in Perfetto or chrome://tracing), DIR/kernels.md and DIR/kernels.json, one table per phase:

  CUDA: one row per kernel name: calls, device time, share of the phase's step time, and GB/s
        where the bytes are known: a matmul op (aten::mm, addmm, bmm, baddbmm, linear, recorded
        with its shapes) is linked to the kernels it launched through the profiler's correlation
        ids, and its inputs + output bytes go to the longest of them.
  CPU:  one row per op: calls, self CPU time, share, and GB/s for the matmul ops (bytes over the
        op's whole time).

Kernels replayed from a CUDA graph have no op above them: one more decode step is profiled
without the graphs, and each graph kernel gets the bytes per call of the same kernel there.
When the profiler sees no kernels at all inside graph replays, decode is profiled again without
the graphs and the table says so. Before torch 2.12 the profiler records no argument dtypes:
matmul operands are then taken to have the model's dtype.
"""

import json
import math
from bisect import bisect_right
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

from graphllm.bench.workload import format_rows, params_for, synchronizer

RANGE = "graphllm.bench::"
MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::linear")
ELEMENT_BYTES = {"float": 4, "double": 8, "c10::BFloat16": 2, "c10::Half": 2, "c10::Float8_e4m3fn": 1,
                 "c10::Float8_e5m2": 1, "signed char": 1, "unsigned char": 1, "int": 4, "long int": 8}
NAME_WIDTH = 72


def matmul_bytes(name: str, shapes: list, dtypes: list) -> int | None:
    """Bytes a matmul op reads and writes: its operands plus its output; None if unknown.

    Operands by position among the tensor arguments (an `out=` tensor, last, is not one):
    linear(x [..., K], w [N, K], bias?); mm/bmm(a [..., M, K], b [..., K, N]); addmm/baddbmm(bias, a, b).
    """
    tensors = [(s, d) for s, d in zip(shapes, dtypes) if s and d in ELEMENT_BYTES]
    with_bias = name in ("aten::addmm", "aten::baddbmm")
    if name not in MATMUL_OPS or len(tensors) < 2 + with_bias:
        return None
    if name == "aten::linear":  # bias, when given, is the third tensor; linear has no out=
        (x, dtype), (w, _) = tensors[0], tensors[1]
        operands, out = tensors, math.prod(x[:-1]) * w[0]
    else:
        operands = tensors[:2 + with_bias]
        (a, dtype), (b, _) = operands[-2], operands[-1]
        out = math.prod(a[:-1]) * b[-1]
    return sum(math.prod(s) * ELEMENT_BYTES[d] for s, d in operands) + out * ELEMENT_BYTES[dtype]


def run_steps(engine, prompts: list[list[int]], decode_steps: int) -> None:
    """Prefill the batch, then `decode_steps` decode steps, each in its phase's range."""
    sync = synchronizer(engine.state.device)
    ids = [engine.add_request(p, params_for(decode_steps + 1)) for p in prompts]
    seqs = [seq for i in ids for seq in engine.requests[i].seqs]
    done = set()
    while len(done) < len(ids):
        # the phase of the step this call launches (under async scheduling it reads back the one before)
        prefill = any(seq.num_computed_tokens < seq.num_prompt_tokens for seq in seqs)
        if all(seq.stopping or seq.is_finished for seq in seqs):  # async: only the last tokens to read back
            outs = engine.step()
        else:
            with record_function(RANGE + ("prefill" if prefill else "decode")):
                outs = engine.step()
                sync()
        done.update(out.request_id for out in outs if out.finished)


def profiled(engine, prompts: list[list[int]], decode_steps: int):
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if engine.state.device.type == "cuda" else [])
    with profile(activities=activities, record_shapes=True) as prof:
        run_steps(engine, prompts, decode_steps)
    return prof


def step_ranges(events) -> list[tuple[float, float, str]]:
    """(start_us, end_us, phase) of every profiled step, in time order."""
    return sorted((e.time_range.start, e.time_range.end, e.name[len(RANGE):]) for e in events
                  if e.device_type == DeviceType.CPU and e.name.startswith(RANGE))


def phase_of(ranges: list[tuple], start_us: float) -> str:
    """The phase of the last step that began before `start_us`."""
    i = max(bisect_right([r[0] for r in ranges], start_us) - 1, 0)
    return ranges[i][2]


def is_kernel(e) -> bool:
    return e.device_type == DeviceType.CUDA and not e.is_user_annotation and not e.name.startswith(RANGE)


def device_rows(events, ranges, dtype: str) -> dict[str, dict[str, dict]]:
    """phase -> kernel name -> {calls, us, own_us, bytes, bytes_us} from the device events and their ops. own_us:
    the part of each call after every kernel that began before it had ended (own_times)."""
    rows: dict[str, dict[str, dict]] = {}
    row = lambda phase, name: rows.setdefault(phase, {}).setdefault(  # noqa: E731
        name, {"calls": 0, "us": 0.0, "own_us": 0.0, "bytes": 0, "bytes_us": 0.0})
    kernels = sorted((e for e in events if is_kernel(e)), key=lambda e: e.time_range.start)
    for e, own in zip(kernels, own_times(kernels)):
        r = row(phase_of(ranges, e.time_range.start), e.name)
        r["calls"] += 1
        r["us"] += e.time_range.end - e.time_range.start
        r["own_us"] += own
    for op in events:
        nbytes = op.kernels and matmul_bytes(op.name, op.input_shapes, input_dtypes(op, dtype))
        if nbytes:
            kernel = max(op.kernels, key=lambda k: k.duration)
            r = row(phase_of(ranges, op.time_range.start), kernel.name)
            r["bytes"] += nbytes
            r["bytes_us"] += kernel.duration
    return rows


def own_times(kernels) -> list[float]:
    """Each kernel's time (us) after the kernels that began before it had ended, in start order: a programmatic
    dependent (PDL) starts while the kernel before it runs and waits, and its own time leaves that wait out. Copies
    and memsets may run beside the kernels (copy engines): they keep their whole time and cover nothing."""
    covered, out = float("-inf"), []
    for e in kernels:
        start, end = e.time_range.start, e.time_range.end
        if e.name.startswith(("Memcpy", "Memset")):
            out.append(end - start)
            continue
        out.append(max(0.0, end - max(start, covered)))
        covered = max(covered, end)
    return out


DTYPE_NAMES = {"torch.float32": "float", "torch.bfloat16": "c10::BFloat16", "torch.float16": "c10::Half"}


def input_dtypes(e, fallback: str) -> list:
    """The op's argument dtypes. FunctionEvent records them from torch 2.12 on; before, every
    tensor argument of a matmul is taken to have the model's dtype."""
    return getattr(e, "input_dtypes", None) or [fallback] * len(e.input_shapes)


def graph_kernel_bytes(graph_rows: dict[str, dict], plain_rows: dict[str, dict]) -> dict[str, dict]:
    """Give kernels replayed from a CUDA graph the bytes per call that the same kernel moved in a
    plain (graph-free) run of the same step, where its matmul op was recorded above it."""
    for name, r in graph_rows.items():
        plain = plain_rows.get(name)
        if r["bytes_us"] or not plain or not plain["bytes"]:
            continue
        r["bytes"] = plain["bytes"] / plain["calls"] * r["calls"]
        r["bytes_us"] = r["us"]
    return graph_rows


def matmul_below(e) -> bool:
    """True for composite ops (aten::linear -> aten::matmul -> aten::mm): their bytes count once, below."""
    return any(c.name in MATMUL_OPS or matmul_below(c) for c in e.cpu_children)


def cpu_rows(events, ranges, dtype: str) -> dict[str, dict[str, dict]]:
    """phase -> op name -> {calls, us (self CPU time), bytes, bytes_us}."""
    rows: dict[str, dict[str, dict]] = {}
    for e in events:
        if e.device_type != DeviceType.CPU or e.is_user_annotation or e.name.startswith(RANGE):
            continue
        r = rows.setdefault(phase_of(ranges, e.time_range.start), {}).setdefault(
            e.name, {"calls": 0, "us": 0.0, "bytes": 0, "bytes_us": 0.0})
        r["calls"] += 1
        r["us"] += e.self_cpu_time_total
        r["own_us"] = r["us"]  # self times do not overlap
        if not matmul_below(e) and (nbytes := matmul_bytes(e.name, e.input_shapes, input_dtypes(e, dtype))):
            r["bytes"] += nbytes
            r["bytes_us"] += e.time_range.end - e.time_range.start
    return rows


def phase_tables(rows: dict[str, dict[str, dict]], ranges) -> dict[str, dict]:
    """Per phase: steps, mean step ms, and the rows sorted by time, with share and GB/s."""
    tables = {}
    for phase in ("prefill", "decode"):
        step_us = sum(end - start for start, end, p in ranges if p == phase)
        steps = sum(1 for r in ranges if r[2] == phase)
        table = sorted(rows.get(phase, {}).items(), key=lambda kv: -kv[1]["us"])
        tables[phase] = {"steps": steps, "step_ms": step_us / 1e3 / max(steps, 1), "rows": [
            {"name": name, "calls": r["calls"], "time_ms": r["us"] / 1e3, "own_ms": r.get("own_us", r["us"]) / 1e3,
             "share": r["us"] / step_us if step_us else None,
             "gb_s": r["bytes"] / r["bytes_us"] / 1e3 if r["bytes_us"] else None} for name, r in table]}
    return tables


def decode_kernels_visible(events, ranges) -> bool:
    return any(is_kernel(e) and not e.name.startswith(("Memcpy", "Memset"))
               and phase_of(ranges, e.time_range.start) == "decode" for e in events)


def profile_engine(engine, prompts: list[list[int]], decode_steps: int, out_dir: Path) -> dict:
    """Profile one batch (prefill, then `decode_steps` decode steps); write the trace and kernels.md."""
    if decode_steps < 1:
        raise ValueError("--profile-steps must be at least 1")
    out_dir.mkdir(parents=True, exist_ok=True)
    cuda, graphs = engine.state.device.type == "cuda", engine.runner.graphs
    prof = profiled(engine, prompts, decode_steps)
    events, graphs_note = prof.events(), "under CUDA graphs" if graphs else "without CUDA graphs"
    if graphs and not decode_kernels_visible(events, step_ranges(events)):
        engine.runner.graphs = None  # kernels inside graph replays were invisible: profile the plain step
        try:
            prof = profiled(engine, prompts, decode_steps)
        finally:
            engine.runner.graphs = graphs
        events, graphs = prof.events(), None
        graphs_note = "WITHOUT CUDA graphs (the profiler saw no kernels inside graph replays)"
    prof.export_chrome_trace(str(out_dir / "trace.json"))
    ranges = step_ranges(events)
    dtype = DTYPE_NAMES.get(str(engine.state.dtype), "")  # for events that do not record dtypes
    rows = device_rows(events, ranges, dtype) if cuda else cpu_rows(events, ranges, dtype)
    if cuda and graphs:  # bytes per kernel from one plain decode step, applied to the graph's kernels
        engine.runner.graphs = None
        try:
            plain = profiled(engine, prompts, 1).events()
        finally:
            engine.runner.graphs = graphs
        plain_rows = device_rows(plain, step_ranges(plain), dtype).get("decode", {})
        graph_kernel_bytes(rows.get("decode", {}), plain_rows)
    what = "CUDA kernels, device time" if cuda else "CPU ops, self CPU time"
    header = (f"{what}; batch {len(prompts)} x {len(prompts[0])} prompt tokens; decode {graphs_note}; "
              "GB/s = matmul operands + output bytes / time"
              + ("; a graph-replayed kernel gets the bytes per call of the same kernel in a plain decode step"
                 if graphs else "")
              + (f"; {PDL_NOTE}" if cuda and pdl_in_use(engine) else ""))
    report = {"dir": str(out_dir), "trace": str(out_dir / "trace.json"), "header": header,
              "phases": phase_tables(rows, ranges)}
    (out_dir / "kernels.md").write_text(format_markdown(report))
    (out_dir / "kernels.json").write_text(json.dumps(report, indent=1))
    return report


PDL_NOTE = ("kernels launched as programmatic dependents (PDL): each one's time includes its wait for the kernel "
            "before, so times overlap and can sum past the step; own ms leaves each call's time before the "
            "kernels begun before it ended out (its wait); --no-enable-pdl profiles a split of the step")


def pdl_in_use(engine) -> bool:
    """Whether the engine's kernels launch as programmatic dependents (EngineConfig.enable_pdl on sm_90+), so that
    the profiler's kernel times overlap (a dependent starts before the kernel before it ends, and waits)."""
    device = engine.state.device
    return (getattr(engine.config, "enable_pdl", False) and device.type == "cuda"
            and torch.cuda.get_device_capability(device) >= (9, 0))


def short(name: str) -> str:
    return name if len(name) <= NAME_WIDTH else name[:NAME_WIDTH - 3] + "..."


def cells(row: dict) -> tuple:
    share = "-" if row["share"] is None else f"{row['share']:.1%}"
    return (short(row["name"]), row["calls"], f"{row['time_ms']:.3f}", f"{row.get('own_ms', row['time_ms']):.3f}",
            share, "-" if row["gb_s"] is None else f"{row['gb_s']:.3g}")


HEAD = ("kernel / op", "calls", "total ms", "own ms", "share of step", "GB/s")


def format_profile(report: dict, top: int = 20) -> str:
    lines = [f"profile ({report['header']}); trace: {report['trace']}"]
    for phase, t in report["phases"].items():
        lines.append(f"\n{phase}: {t['steps']} steps, {t['step_ms']:.2f} ms per step")
        lines.append(format_rows([HEAD] + [cells(r) for r in t["rows"][:top]], left=1))
    return "\n".join(lines)


def format_markdown(report: dict, top: int = 60) -> str:
    lines = ["# graphllm bench profile", "", report["header"], "", f"Trace: `{report['trace']}`"]
    for phase, t in report["phases"].items():
        lines += ["", f"## {phase}: {t['steps']} steps, {t['step_ms']:.2f} ms per step", "",
                  "| " + " | ".join(HEAD) + " |", "|" + " --- |" * len(HEAD)]
        lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in cells(r)) + " |" for r in t["rows"][:top]]
        if len(t["rows"]) > top:
            lines.append(f"\n{len(t['rows']) - top} more rows in kernels.json")
    return "\n".join(lines) + "\n"
