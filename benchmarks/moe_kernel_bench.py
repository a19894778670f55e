"""The fused MoE op (graphllm/kernels/fused_moe.py: routing, gate/up with SiLU·mul, down with the k-sum) on
the GPU, at Qwen3-30B-A3B's and Mixtral-8x7B's layer shapes, against the bytes one call must read.

    python benchmarks/moe_kernel_bench.py [OUT.json [TOKENS [MODELS [pdl]]]]    (H100 / H200; a few minutes)

TOKENS: a comma list of token counts (default 1,8,32,256); MODELS: qwen3,mixtral (default both); pdl: the graphs
captured with programmatic dependent launch, as the engine's are (one token then also times "plan, early down":
the down slabs fetched into L2 while gate/up streams, moe_experts.py's EARLY).

Each model gets LAYERS[model] layers of its own random bf16 weights (more than STREAM_BYTES in all, so
every call streams its experts from HBM, not L2) and random float32 router logits per layer and token
count. A call is torch.ops.graphllm.fused_moe-equivalent fused_moe(x, logits, w13, w2, k, renormalize);
timings replay a CUDA graph of one call per layer, the median of quant_kernel_sweep.TRIALS replays, divided by the layers.

The ceiling is the bytes a call must read: the chosen experts' w13 and w2 (each distinct expert once,
counted from the routing) plus x, the logits and the output; "% copy" divides that by a device-to-device
copy's bandwidth (read + write) measured in the same run. Besides fused_moe's own plan ("plan") each
token count times a few candidate tile configs (CANDIDATES; each checked against the PyTorch reference on
the first layer before it is timed; one that fails to compile or to match is reported and skipped), so a
better plan() can be read off the table. The JSON holds every row.
"""

import json
import statistics
import sys

import torch
import triton

from graphllm.kernels.fused_moe import fused_moe, fused_moe_reference, plan
from graphllm.kernels.launch import programmatic_launch
from quant_kernel_sweep import copy_bandwidth, graph_seconds  # noqa: E402  (run as a script: benchmarks/ on the path)

MODELS = {  # hidden, moe intermediate, experts, top_k, renormalize (norm_topk_prob)
    "qwen3": (2048, 768, 128, 8, True),
    "mixtral": (4096, 14336, 8, 2, True),
}
LAYERS = {"qwen3": 8, "mixtral": 4}  # 9.6 GB and 11.3 GB of experts
TOKENS = (1, 8, 32, 256)
STREAM_BYTES = 400e6  # 8x the H200's L2: every layer's experts come from HBM
DTYPE = torch.bfloat16
DEVICE = "cuda"


def candidates(num_tokens: int) -> dict[str, dict]:
    """Tile configs to time beside plan()'s, by token count (fused_experts' config keys)."""
    if num_tokens == 1:
        gemv = {"SORTED": False, "BLOCK_M": 1, "num_warps": 4, "num_stages": 4}
        # the down kernel took 11.7 us for Qwen3's 25 MB at one token on the H200 (51% of the copy rate; gate/up 74%,
        # s32 moe-prof1-nopdl): wider down tiles (fewer, larger programs) beside plan()'s gate/up
        down = {f"down{n}x{k}": {**gemv, "gate_up": (16, 256), "down": (n, k)}
                for n, k in ((32, 256), (64, 256), (32, 512), (64, 128), (16, 512))}
        return {**down, "plan, early down": {**plan(1, 8, 128), "early_down": True},
                "gemv16x128": {**gemv, "gate_up": (16, 128), "down": (16, 128)},
                "gemv32x256": {**gemv, "gate_up": (32, 256), "down": (32, 256)},
                "gemv16x512": {**gemv, "gate_up": (16, 512), "down": (16, 512), "num_stages": 3},
                "dot16:32x128": {"SORTED": False, "BLOCK_M": 16, "gate_up": (32, 128), "down": (32, 128),
                                 "num_warps": 4, "num_stages": 4}}
    if num_tokens <= 64:
        scan = {"SORTED": False, "num_warps": 4, "num_stages": 4}
        return {"scan:16x256": {**scan, "gate_up": (16, 256), "down": (16, 256)},
                "scan:64x128": {**scan, "gate_up": (64, 128), "down": (64, 128)},
                "scan:32x256s3": {**scan, "gate_up": (32, 256), "down": (32, 256), "num_stages": 3},
                "sorted:64x64": {"SORTED": True, "BLOCK_M": 16, "gate_up": (64, 64), "down": (64, 64),
                                 "num_warps": 4, "num_stages": 3}}
    sorted_ = {"SORTED": True, "num_warps": 4, "num_stages": 3}
    return {"sorted:128x64": {**sorted_, "gate_up": (128, 64), "down": (128, 64)},
            "sorted:64x128w8": {**sorted_, "gate_up": (64, 128), "down": (64, 128), "num_warps": 8},
            "sorted:bm64": {**sorted_, "BLOCK_M": 64, "gate_up": (64, 64), "down": (128, 64)}}


def make_layers(model: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """LAYERS[model] layers of (w13 [E, 2I, H], w2 [E, H, I]) in DTYPE."""
    hidden, size, experts, _, _ = MODELS[model]
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    layers = []
    for _ in range(LAYERS[model]):
        w13 = torch.randn((experts, 2 * size, hidden), device=DEVICE, dtype=DTYPE, generator=gen) / hidden ** 0.5
        w2 = torch.randn((experts, hidden, size), device=DEVICE, dtype=DTYPE, generator=gen) / size ** 0.5
        layers.append((w13, w2))
    assert sum(w13.nbytes + w2.nbytes for w13, w2 in layers) > STREAM_BYTES
    return layers


def bytes_read(logits: torch.Tensor, x: torch.Tensor, model: str) -> int:
    """The bytes a call must read and write: its distinct experts' weights, x, the logits and the output."""
    hidden, size, experts, top_k, _ = MODELS[model]
    used = logits.float().topk(top_k, dim=-1).indices.unique().numel()
    per_expert = 3 * hidden * size * torch.finfo(DTYPE).bits // 8
    return used * per_expert + 2 * x.nbytes + logits.nbytes


def time_config(model: str, layers: list, inputs: list, config: dict | None) -> dict:
    """us per layer for one config, or the error; checked against the reference on the first layer."""
    _, _, _, top_k, renormalize = MODELS[model]
    x, logits = inputs[0]
    try:
        got = fused_moe(x, logits, *layers[0], top_k, renormalize, config)
        expected = fused_moe_reference(x, logits, *layers[0], top_k, renormalize)
        err = (got.float() - expected.float()).abs().max().item()
        if not err <= 2e-2 * max(1.0, expected.float().abs().max().item()):
            return {"error": f"max error {err:.3g}"}
        calls = [lambda w=w, xl=xl: fused_moe(*xl, *w, top_k, renormalize, config) for w, xl in zip(layers, inputs)]
        return {"us": graph_seconds(calls) * 1e6, "err": err}
    except Exception as exc:  # noqa: BLE001 - a candidate that fails is reported, not fatal
        return {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}


def bench_model(model: str, tokens: tuple, copy_gb_s: float) -> list[dict]:
    hidden, _, experts, top_k, _ = MODELS[model]
    layers = make_layers(model)
    rows = []
    for t in tokens:
        gen = torch.Generator(device=DEVICE).manual_seed(t)
        inputs = [(torch.randn((t, hidden), device=DEVICE, dtype=DTYPE, generator=gen),
                   torch.randn((t, experts), device=DEVICE, dtype=torch.float32, generator=gen)) for _ in layers]
        nbytes = statistics.mean(bytes_read(logits, x, model) for x, logits in inputs)
        row = {"model": model, "tokens": t, "bytes": nbytes, "plan": plan(t, top_k, experts), "configs": {}}
        for name, config in [("plan", None), *candidates(t).items()]:
            row["configs"][name] = time_config(model, layers, inputs, config)
            print(f"{model} T={t} {name}: {row['configs'][name]}", file=sys.stderr, flush=True)
        timed = {n: c["us"] for n, c in row["configs"].items() if "us" in c}
        if timed:
            best = min(timed, key=timed.get)
            row |= {"best": best, "best_us": timed[best], "plan_us": timed.get("plan"),
                    "ceiling_us": nbytes / copy_gb_s / 1e3}
        rows.append(row)
    del layers
    torch.cuda.empty_cache()
    return rows


def print_table(report: dict) -> None:
    copy = report["copy_gb_s"]
    print(f"copy {copy:.0f} GB/s on {report['device']}; us per MoE layer (routing included), experts from HBM, "
          f"PDL {'on' if report['pdl'] else 'off'}")
    print("model    T   plan_us %copy  best_us %copy  ceiling_us  MB_read  best")
    for r in report["rows"]:
        if "best" not in r:
            print(f"{r['model']:<7} {r['tokens']:>3}  all configs failed: {r['configs']}")
            continue
        plan_us = r["plan_us"] or float("nan")
        print(f"{r['model']:<7} {r['tokens']:>3} {plan_us:8.1f} {100 * r['ceiling_us'] / plan_us:4.0f}% "
              f"{r['best_us']:8.1f} {100 * r['ceiling_us'] / r['best_us']:4.0f}% {r['ceiling_us']:10.1f} "
              f"{r['bytes'] / 1e6:8.1f}  {r['best']}")


def main() -> None:
    out_path = sys.argv[1] if len(sys.argv) > 1 else "moe_kernel_bench.json"
    tokens = tuple(int(t) for t in sys.argv[2].split(",")) if len(sys.argv) > 2 else TOKENS
    models = sys.argv[3].split(",") if len(sys.argv) > 3 else list(MODELS)
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "rows": []}
    report["copy_gb_s"] = copy_bandwidth() / 1e9
    report["pdl"] = len(sys.argv) > 4 and sys.argv[4] == "pdl"
    for model in models:
        with programmatic_launch(report["pdl"]):
            report["rows"] += bench_model(model, tokens, report["copy_gb_s"])
        with open(out_path, "w") as f:  # what is done so far survives a later failure
            json.dump(report, f, indent=1, default=str)
    print_table(report)


if __name__ == "__main__":
    main()
