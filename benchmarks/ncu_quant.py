"""Hardware counters of the quantized matmul kernels at the Llama-3-8B shapes, for `gpu_run.sh ncu-quant`.

    python benchmarks/ncu_quant.py launch          # the launches ncu profiles (run under ncu, below)
    python benchmarks/ncu_quant.py table CSV       # ncu's CSV -> one line per launch, stall reasons first
    python benchmarks/ncu_quant.py count|metrics   # what gpu_run.sh passes to ncu

gpu_run.sh runs `ncu --clock-control none --csv --metrics METRICS python benchmarks/ncu_quant.py launch`, which
launches each kernel of CASES once more after a warm-up (ncu replays each profiled launch for its counters),
then prints the table. What it answers: whether a kernel waits on memory (long scoreboard, low DRAM %), on its
own instruction issue (issue active near 100%), or on barriers and shared memory between its loads and its dot.
"""

import torch

from graphllm.kernels import quant_layout as ql
from graphllm.kernels.fp8_matmul import fp8_matmul_quantized, fp8_quantize_rows
from graphllm.kernels.int4_matmul import int4_matmul
from ncu_table import main

SHAPES = {"qkv": (6144, 4096), "o_proj": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
CASES = [("int4", 16, s) for s in SHAPES] + [("int4", 1, s) for s in SHAPES] + [("fp8q", 1, s) for s in SHAPES]
def calls() -> list:
    torch.manual_seed(0)
    out = []
    for kernel, m, shape in CASES:
        n, k = SHAPES[shape]
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        if kernel == "int4":
            q = ql.quantize_int4_weight(w, 128)
            out.append(lambda x=x, q=q: int4_matmul(x, q[0], q[1], q[2]))
        else:
            w8, ws = ql.quantize_fp8_weight(w)
            xq, xs = fp8_quantize_rows(x)
            out.append(lambda xq=xq, xs=xs, w8=w8, ws=ws: fp8_matmul_quantized(xq, xs, w8, ws, None, torch.bfloat16))
    return out


if __name__ == "__main__":
    main(calls, [f"{kernel} m={m} {shape}" for kernel, m, shape in CASES])
