"""Where fp8 W8A8's large-M linears stand (issue 15's throughput target): torch._scaled_mm at the Llama-3-8B
shapes from 128 to 4,096 rows, row-wise (what graphllm runs past 64 rows) and per-tensor scales, each with and
without use_fast_accum, against bf16 cuBLAS; x already float8 (the graph quantizes it in its producer).

    python benchmarks/fp8_gemm_large_m.py OUT.json [MS]      (an sm_89+ GPU; about a minute)

Timings replay a CUDA graph of calls over distinct weight copies (together ~400 MB, so the weights stream from
HBM at the small M), the median of 7 replays (quant_kernel_sweep.graph_seconds); TFLOP/s counts 2 * M * N * K.
Each variant's output is checked against the float32 product of the dequantized operands (max error relative to
max |ref|), fast accumulation included, so that its rounding cost is on the same line as its speed.
"""

import json
import sys

import torch
import torch.nn.functional as F

from quant_kernel_sweep import graph_seconds  # benchmarks/, the script's own folder

SHAPES = {"qkv": (6144, 4096), "o_proj": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
MS = (128, 256, 512, 1024, 2048, 4096)
STREAM_BYTES = 400e6


def graph_us(calls: list) -> float:
    """Median microseconds of one call, from CUDA-graph replays of all calls in sequence."""
    return graph_seconds(calls) * 1e6


def row_quantize(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row float8 e4m3 and float32 scales [R, 1] (amax / 448)."""
    scale = t.float().abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 448.0
    return (t.float() / scale).clamp(-448, 448).to(torch.float8_e4m3fn), scale


def measure(name: str, n: int, k: int, m: int) -> dict:
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    wq, w_scale = row_quantize(w)
    xq, x_scale = row_quantize(x)
    ref = (xq.float() * x_scale) @ (wq.float() * w_scale).t()
    one = torch.ones((), device="cuda")
    copies = max(2, int(STREAM_BYTES // (n * k)) + 1)
    fp8 = [(wq, w_scale.t().contiguous(), one)] + [(wq.clone(), w_scale.t().contiguous(), one) for _ in range(copies - 1)]
    bf16 = [w] + [w.clone() for _ in range(max(1, int(STREAM_BYTES // (2 * n * k))))]
    flop = 2 * m * n * k
    row = {"shape": name, "m": m, "n": n, "k": k}
    us = graph_us([lambda w=w: F.linear(x, w) for w in bf16])
    row["bf16"] = {"us": us, "tflops": flop / us / 1e6}
    # per-tensor: x's largest row scale for every row, w's as the copies hold it (one): checked against its own
    x_t = x_scale.max().reshape(())
    xq_t = (x.float() / x_t).clamp(-448, 448).to(torch.float8_e4m3fn)
    forms = {"rowwise": (xq, x_scale, 1, ref), "tensor": (xq_t, x_t, 2, (xq_t.float() * x_t) @ wq.float().t())}
    for form, (xin, sa, b, ref_form) in forms.items():
        for fast in (False, True):
            call = (lambda w, xin=xin, sa=sa, b=b, f=fast: torch._scaled_mm(
                xin, w[0].t(), scale_a=sa, scale_b=w[b], out_dtype=torch.bfloat16, use_fast_accum=f))
            try:
                got = call(fp8[0]).float()
                err = ((got - ref_form).abs().max() / ref_form.abs().max()).item()
                us = graph_us([lambda w=w: call(w) for w in fp8])
                row[form + ("-fast" if fast else "")] = {"us": us, "tflops": flop / us / 1e6, "rel_err": err}
            except Exception as exc:  # noqa: BLE001 - a form this torch build lacks: recorded, not fatal
                row[form + ("-fast" if fast else "")] = {"error": f"{type(exc).__name__}: {str(exc)[:160]}"}
    del fp8, bf16
    torch.cuda.empty_cache()
    return row


def main() -> None:
    out_path = sys.argv[1]
    ms = tuple(int(v) for v in sys.argv[2].split(",")) if len(sys.argv) > 2 else MS
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": []}
    for name, (n, k) in SHAPES.items():
        for m in ms:
            report["rows"].append(measure(name, n, k, m))
            with open(out_path, "w") as f:
                json.dump(report, f, indent=1)
    cols = ("bf16", "rowwise", "rowwise-fast", "tensor", "tensor-fast")
    print(f"{report['device']}, torch {report['torch']}: us per call (TFLOP/s), x already float8")
    print(f"{'shape':<8}{'M':>6}" + "".join(f"{c:>22}" for c in cols) + "   err rowwise / -fast")
    for r in report["rows"]:
        cells = [f"{r[c]['us']:9.1f} ({r[c]['tflops']:5.0f})" if "us" in r[c] else "      error" for c in cols]
        errs = " / ".join(f"{r[c].get('rel_err', float('nan')):.1e}" for c in ("rowwise", "rowwise-fast"))
        print(f"{r['shape']:<8}{r['m']:>6}" + "".join(f"{c:>22}" for c in cells) + f"   {errs}")


if __name__ == "__main__":
    main()
