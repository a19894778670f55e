"""One token's MoE routing on the GPU: the router's matmul and the expert choice, as two launches (graphllm.linear,
then topk_softmax) and as fuse_moe_router's one (moe_router.router_topk), and topk_softmax alone.

    python benchmarks/moe_router_bench.py [OUT.json]        (H100 / H200; under a minute)
    PYTHONPATH=.ab python benchmarks/moe_router_bench.py OUT.json    (another tree's kernels; rows it lacks skipped)

Each model's router shape gets enough random bf16 weights (STREAM_BYTES in all, four times the H200's L2, so each
call reads its weight from HBM, as in a decode step); timings replay a CUDA graph of one call per layer (quant_kernel_sweep.graph_seconds:
the median of its trials, divided by the layers), without programmatic dependent launch. Each path's choice is
checked against topk_softmax over the same logits on the first layer before it is timed.
"""

import json
import sys

import torch
import triton

import graphllm.ops.linear  # noqa: F401  (registers graphllm.linear)
from graphllm.kernels.moe_routing import topk_softmax
from quant_kernel_sweep import graph_seconds  # noqa: E402  (run as a script: benchmarks/ on the path)

MODELS = {"qwen3-30b-a3b": (2048, 128, 8), "deepseek-v2-lite": (2048, 64, 6), "mixtral-8x7b": (4096, 8, 2)}
STREAM_BYTES = 200e6
DTYPE = torch.bfloat16


def two_launches(x, w, top_k):
    return topk_softmax(torch.ops.graphllm.linear(x, w), top_k, True)


def paths() -> dict:
    found = {"linear + topk_softmax": two_launches}
    try:
        from graphllm.kernels.moe_router import router_topk
    except ImportError:  # a tree from before fuse_moe_router
        return found
    return found | {"router_topk": lambda x, w, top_k: router_topk(x, w, top_k, True)}


def bench(model: str) -> dict:
    hidden, experts, top_k = MODELS[model]
    gen = torch.Generator(device="cuda").manual_seed(0)
    layers = int(STREAM_BYTES // (experts * hidden * DTYPE.itemsize))  # Qwen3: 381, Mixtral: 3,051
    ws = [torch.randn((experts, hidden), device="cuda", dtype=DTYPE, generator=gen) / hidden ** 0.5
          for _ in range(layers)]
    xs = [torch.randn((1, hidden), device="cuda", dtype=DTYPE, generator=gen) for _ in range(layers)]
    logits = [torch.ops.graphllm.linear(x, w) for x, w in zip(xs, ws)]
    row = {"topk_softmax alone": graph_seconds([lambda lg=lg: topk_softmax(lg, top_k, True) for lg in logits]) * 1e6}
    for name, run in paths().items():
        weights, ids = run(xs[0], ws[0], top_k)
        ref_weights, ref_ids = topk_softmax(logits[0], top_k, True)
        if not torch.equal(ids.sort(-1).values, ref_ids.sort(-1).values):  # a near tie summed in another order
            row[f"{name} ids"] = f"{ids.tolist()} against {ref_ids.tolist()}"
        row[name] = graph_seconds([lambda x=x, w=w: run(x, w, top_k) for x, w in zip(xs, ws)]) * 1e6
    return row


def main() -> None:
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "us": {model: bench(model) for model in MODELS}}
    with open(sys.argv[1] if len(sys.argv) > 1 else "moe_router_bench.json", "w") as f:
        json.dump(report, f, indent=1)
    print(f"us per call on {report['device']}, one token, weights from HBM, no PDL")
    for model, row in report["us"].items():
        print(f"{model:<18} " + "  ".join(f"{k}: {v:.2f}" if isinstance(v, float) else f"{k}: {v}"
                                          for k, v in row.items()))


if __name__ == "__main__":
    main()
