"""Nsight Compute's counters as one line per launch: the metrics the ncu_* scripts ask for and their table.

What a line answers: whether a kernel waits on memory (long scoreboard, low DRAM %), on its own instruction issue
(issue active near 100%), on barriers and shared memory between its loads and its dots, or on too few warps.
"""

import csv
import sys
from typing import Callable

STALLS = ["long_scoreboard", "short_scoreboard", "barrier", "wait", "mio_throttle", "lg_throttle",
          "math_pipe_throttle", "not_selected", "selected", "dispatch_stall", "no_instruction", "membar",
          "branch_resolving", "drain", "imc_miss", "misc", "sleeping", "tex_throttle"]
METRICS = ["gpu__time_duration.sum", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
           "dram__bytes_read.sum", "sm__warps_active.avg.pct_of_peak_sustained_active",
           "smsp__issue_active.avg.pct_of_peak_sustained_active", "launch__registers_per_thread",
           "launch__shared_mem_per_block_static", "launch__shared_mem_per_block_dynamic",
           "launch__occupancy_limit_registers", "launch__occupancy_limit_shared_mem", "launch__grid_size",
           "smsp__inst_executed.sum"] + [f"smsp__average_warps_issue_stalled_{s}_per_issue_active.ratio"
                                          for s in STALLS]


def table(path: str, cases: list[str]) -> None:
    """ncu's CSV at path -> one line per launch, named by cases in launch order, stall reasons first."""
    rows = list(csv.DictReader(line for line in open(path) if line.startswith('"')))
    launches: dict[str, dict] = {}
    for row in rows:
        value = row["Metric Value"]
        if row["Metric Name"] == "gpu__time_duration.sum":  # in us, whatever unit ncu chose
            scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3}.get(row.get("Metric Unit", "nsecond"), 1e-3)
            value = float(value.replace(",", "")) * scale
        if row["Metric Name"] == "dram__bytes_read.sum":  # in GB
            scale = {"byte": 1e-9, "Kbyte": 1e-6, "Mbyte": 1e-3, "Gbyte": 1.0}.get(row.get("Metric Unit", "byte"), 1e-9)
            value = float(value.replace(",", "")) * scale
        launches.setdefault(row["ID"], {"name": row["Kernel Name"][:28]})[row["Metric Name"]] = value
    cases = iter(cases)
    print("case | kernel | us | DRAM % | GB read | warps active % | issue active % | regs | blocks/SM by regs, "
          "by smem | grid | top stalls (warps per issued instruction)")
    for _, values in sorted(launches.items(), key=lambda kv: int(kv[0])):
        def num(key):
            try:
                value = float(str(values.get(key, "nan")).replace(",", ""))
            except ValueError:
                value = float("nan")
            return value if value == value else -1.0  # missing: -1
        stalls = sorted(((num(f"smsp__average_warps_issue_stalled_{s}_per_issue_active.ratio"), s) for s in STALLS),
                        reverse=True)
        top = ", ".join(f"{s} {v:.2f}" for v, s in stalls[:5])
        print(f"{next(cases, '?')} | {values['name']} | {num('gpu__time_duration.sum'):.1f} | "
              f"{num('dram__throughput.avg.pct_of_peak_sustained_elapsed'):.0f} | "
              f"{num('dram__bytes_read.sum'):.4f} | {num('sm__warps_active.avg.pct_of_peak_sustained_active'):.0f} | "
              f"{num('smsp__issue_active.avg.pct_of_peak_sustained_active'):.0f} | "
              f"{num('launch__registers_per_thread'):.0f} | {num('launch__occupancy_limit_registers'):.0f}, "
              f"{num('launch__occupancy_limit_shared_mem'):.0f} | {num('launch__grid_size'):.0f} | {top}")


def launch_twice(calls: list[Callable]) -> None:
    """Each call once to compile and warm up (not profiled: gpu_run.sh's --launch-skip counts these), then once
    more for ncu."""
    import torch
    for call in calls:
        call()
    torch.cuda.synchronize()
    print(f"warm-up launches: {len(calls)}", flush=True)
    for call in calls:
        call()
    torch.cuda.synchronize()


def main(make_calls: Callable[[], list[Callable]], names: list[str]) -> None:
    """An ncu_* script's command line: launch (under ncu), count, metrics, or table CSV."""
    if sys.argv[1] == "launch":
        launch_twice(make_calls())
    elif sys.argv[1] == "count":
        print(len(names))
    elif sys.argv[1] == "metrics":
        print(",".join(METRICS))
    else:
        table(sys.argv[2], names)
