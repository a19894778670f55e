"""Decode kernels of a `bench latency --profile` trace grouped by (name, grid): per-call device time by launch shape.

    python benchmarks/trace_by_shape.py DIR/trace.json [PHASE]   (PHASE: decode, the default, or prefill)

kernels.md groups by kernel name only, so the four int4 GEMVs of a layer (one Triton kernel, four grids) share a
row. Here each (name, grid, block) is a row: calls, mean us a call, and mean "own" us (the part after every kernel
that began before it had ended: under PDL a dependent starts early and waits, graphllm.bench.profiling.own_times),
and the phase's step time for scale. Reads the Chrome trace that torch.profiler exports (kernel events carry
args.grid and args.block).
"""

import json
import sys
from bisect import bisect_right
from pathlib import Path

RANGE = "graphllm.bench::"


def load(path: Path) -> list[dict]:
    data = json.loads(path.read_text())
    return data["traceEvents"] if isinstance(data, dict) else data


def step_ranges(events: list[dict]) -> list[tuple[float, float, str]]:
    return sorted((e["ts"], e["ts"] + e.get("dur", 0), e["name"][len(RANGE):]) for e in events
                  if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith(RANGE))


def kernel_rows(events: list[dict], phase: str) -> tuple[list[dict], int]:
    """Rows of `phase`'s kernels by (name, grid, block), in order of first appearance; and its step count."""
    ranges = step_ranges(events)
    starts = [r[0] for r in ranges]
    kernels = sorted((e for e in events if e.get("cat") == "kernel" and "dur" in e), key=lambda e: e["ts"])
    rows: dict[tuple, dict] = {}
    covered = float("-inf")
    for e in kernels:
        start, end = e["ts"], e["ts"] + e["dur"]
        own = max(0.0, end - max(start, covered))
        covered = max(covered, end)
        i = bisect_right(starts, start) - 1
        if i < 0 or ranges[i][2] != phase:
            continue
        args = e.get("args", {})
        key = (e["name"], tuple(args.get("grid", ())), tuple(args.get("block", ())))
        r = rows.setdefault(key, {"name": e["name"], "grid": key[1], "block": key[2], "calls": 0, "us": 0.0,
                                  "own_us": 0.0})
        r["calls"] += 1
        r["us"] += e["dur"]
        r["own_us"] += own
    return list(rows.values()), sum(1 for r in ranges if r[2] == phase)


def main(argv: list[str]) -> None:
    path, phase = Path(argv[0]), argv[1] if len(argv) > 1 else "decode"
    rows, steps = kernel_rows(load(path), phase)
    if not rows:
        sys.exit(f"{path}: no kernels in {phase} steps")
    total = sum(r["own_us"] for r in rows)
    print(f"{phase}: {steps} steps, kernels' own time {total / max(steps, 1) / 1e3:.3f} ms a step\n")
    print("| kernel | grid | block | calls a step | us a call | own us a call | own ms a step |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in sorted(rows, key=lambda r: -r["own_us"]):
        print(f"| {r['name'][:60]} | {list(r['grid'])} | {list(r['block'])} | {r['calls'] / max(steps, 1):.1f} | "
              f"{r['us'] / r['calls']:.2f} | {r['own_us'] / r['calls']:.2f} | {r['own_us'] / max(steps, 1) / 1e3:.3f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
