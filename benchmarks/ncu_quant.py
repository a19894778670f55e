"""Hardware counters of the quantized matmul kernels at the Llama-3-8B shapes, for `gpu_run.sh ncu-quant`.

    python benchmarks/ncu_quant.py launch          # the launches ncu profiles (run under ncu, below)
    python benchmarks/ncu_quant.py table CSV       # ncu's CSV -> one line per launch, stall reasons first
    python benchmarks/ncu_quant.py count|metrics   # what gpu_run.sh passes to ncu

gpu_run.sh runs `ncu --clock-control none --csv --metrics METRICS python benchmarks/ncu_quant.py launch`, which
launches each kernel of CASES once more after a warm-up (ncu replays each profiled launch for its counters),
then prints the table. What it answers: whether a kernel waits on memory (long scoreboard, low DRAM %), on its
own instruction issue (issue active near 100%), or on barriers and shared memory between its loads and its dot.
"""

import csv
import sys

import torch

from graphllm.kernels import quant_layout as ql
from graphllm.kernels.fp8_matmul import fp8_matmul_quantized, fp8_quantize_rows
from graphllm.kernels.int4_matmul import int4_matmul

SHAPES = {"qkv": (6144, 4096), "o_proj": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
CASES = [("int4", 16, s) for s in SHAPES] + [("int4", 1, s) for s in SHAPES] + [("fp8q", 1, s) for s in SHAPES]
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


def launch() -> None:
    torch.manual_seed(0)
    calls = []
    for kernel, m, shape in CASES:
        n, k = SHAPES[shape]
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        if kernel == "int4":
            q = ql.quantize_int4_weight(w, 128)
            calls.append(lambda x=x, q=q: int4_matmul(x, q[0], q[1], q[2]))
        else:
            w8, ws = ql.quantize_fp8_weight(w)
            xq, xs = fp8_quantize_rows(x)
            calls.append(lambda xq=xq, xs=xs, w8=w8, ws=ws: fp8_matmul_quantized(xq, xs, w8, ws, None, torch.bfloat16))
    for call in calls:  # compile and warm up, not profiled (gpu_run.sh's --launch-skip counts these)
        call()
    torch.cuda.synchronize()
    print(f"warm-up launches: {len(calls)}", flush=True)
    for call in calls:
        call()
    torch.cuda.synchronize()


def table(path: str) -> None:
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
    cases = iter(f"{kernel} m={m} {shape}" for kernel, m, shape in CASES)
    print("case | kernel | us | DRAM % | GB read | warps active % | issue active % | regs | grid | top stalls "
          "(warps per issued instruction)")
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
              f"{num('launch__registers_per_thread'):.0f} | {num('launch__grid_size'):.0f} | {top}")


if __name__ == "__main__":
    if sys.argv[1] == "launch":
        launch()
    elif sys.argv[1] == "count":
        print(len(CASES))
    elif sys.argv[1] == "metrics":
        print(",".join(METRICS))
    else:
        table(sys.argv[2])
