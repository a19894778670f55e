"""Does a decode step's attention overlap its GEMMs on one GPU? Measured before building an executor for it.

    python benchmarks/overlap_probe.py OUT.json

Issue 19's throughput roofline adds the decode steps' matmul time (compute-bound at 256+ rows) to their KV reads
(bandwidth-bound), and s30's arithmetic put the bf16 run's decode steps 1.2x above that sum. NanoFlow's answer is to
cut the batch in two and run one half's attention while the other half's GEMMs run. Whether two kernels of those
kinds share the SMs well enough for that to pay is what this script measures, at the Llama-3-8B shape with
LAYERS decoder layers (distinct weights; KV caches larger than the L2), each schedule captured in one CUDA graph:

- serial:  per layer, the whole batch: qkv, attention, o_proj, gate_up, SwiGLU, down (today's decode step, less the
           norms and the rotary)
- halves:  the same per half, one half after the other, one stream (what cutting the batch costs by itself)
- overlap: two streams; the first runs the halves' GEMM chunks (o_proj, gate_up, SwiGLU, down of layer L-1, then
           qkv of layer L) in turn, the second each half's attention as soon as its qkv is done, so one half's
           attention runs beside the other half's GEMM chunk (NanoFlow's nano-batches; events fork and join inside
           the graph)
- gemms / attention: each kind alone over the whole batch: the sum is serial's floor, the larger the overlap's.

us per layer for each, at bf16 and float8 caches. overlap < serial by a margin is the go for an executor.
"""

import json
import sys

import torch
import torch.nn.functional as F

from kernel_sweep import HEAD_DIM, HQ, graph_seconds, paged_decode_inputs  # benchmarks/ is the script's sys.path[0]
from graphllm.kernels.paged_decode_attention import paged_decode_attention
from graphllm.kernels.silu_and_mul import silu_and_mul

HIDDEN, QKV, INTER = 4096, 6144, 14336
LAYERS = 4
SHAPES = [(512, 544), (512, 1024), (384, 1024), (256, 1024)]
DTYPE = torch.bfloat16


def layer_weights() -> list[dict]:
    def w(n, k):
        return torch.randn(n, k, device="cuda", dtype=DTYPE) / k ** 0.5
    return [dict(qkv=w(QKV, HIDDEN), o=w(HIDDEN, HIDDEN), gate_up=w(2 * INTER, HIDDEN), down=w(HIDDEN, INTER))
            for _ in range(LAYERS)]


class Half:
    """One part of the batch: its rows' activations and its sequences' attention inputs."""

    def __init__(self, rows: slice, tables, lens, q):
        n = rows.stop - rows.start
        self.x = torch.randn(n, HIDDEN, device="cuda", dtype=DTYPE)
        self.tables, self.lens, self.q = tables[rows], lens[rows], q[rows].contiguous()

    def qkv(self, w):
        F.linear(self.x, w["qkv"])

    def attention(self, cache, scale):
        self.att = paged_decode_attention(self.q, cache[0], cache[1], self.tables, self.lens, scale, 0)

    def post(self, w):
        h = F.linear(self.att.view(self.att.shape[0], -1), w["o"])
        act = silu_and_mul(F.linear(h, w["gate_up"]))
        self.x = F.linear(act, w["down"])


def graph_us_per_layer(schedule) -> float:
    return 1e6 * graph_seconds([schedule], reps=10) / LAYERS


def schedules(weights, caches, whole: Half, halves: list[Half], scale) -> dict:
    def serial(parts):
        def run():
            for i, w in enumerate(weights):
                for p in parts:
                    p.qkv(w)
                    p.attention(caches[i % len(caches)], scale)
                    p.post(w)
        return run

    def gemms():
        whole.att = torch.zeros(whole.x.shape[0], HQ, HEAD_DIM, device="cuda", dtype=DTYPE)
        for w in weights:
            whole.qkv(w)
            whole.post(w)

    def attention():
        for i in range(len(weights)):
            whole.attention(caches[i % len(caches)], scale)

    def overlap():
        main, side = torch.cuda.current_stream(), torch.cuda.Stream()
        side.wait_stream(main)
        attended = [None, None]
        for i, w in enumerate(weights):
            for h, part in enumerate(halves):
                if attended[h] is not None:
                    main.wait_event(attended[h])
                    part.post(weights[i - 1])
                part.qkv(w)
                ready = torch.cuda.Event()
                ready.record(main)
                with torch.cuda.stream(side):
                    side.wait_event(ready)
                    part.attention(caches[i % len(caches)], scale)
                    attended[h] = torch.cuda.Event()
                    attended[h].record(side)
        for h, part in enumerate(halves):
            main.wait_event(attended[h])
            part.post(weights[-1])
        main.wait_stream(side)

    return {"serial_us": graph_us_per_layer(serial([whole])), "halves_us": graph_us_per_layer(serial(halves)),
            "overlap_us": graph_us_per_layer(overlap), "gemms_us": graph_us_per_layer(gemms),
            "attention_us": graph_us_per_layer(attention)}


def main() -> None:
    out = sys.argv[1]
    weights = layer_weights()
    rows, scale = [], HEAD_DIM ** -0.5
    for batch, ctx in SHAPES:
        caches, tables, lens, q, kv_bytes = paged_decode_inputs(batch, ctx)
        for kv in ("bf16", "fp8"):
            if kv == "fp8":
                caches = [c.to(torch.float8_e4m3fn) for c in caches]
            whole = Half(slice(0, batch), tables, lens, q)
            halves = [Half(slice(0, batch // 2), tables, lens, q), Half(slice(batch // 2, batch), tables, lens, q)]
            row = {"batch": batch, "context": ctx, "kv": kv, **schedules(weights, caches, whole, halves, scale)}
            row["floor_sum_us"] = row["gemms_us"] + row["attention_us"]
            row["floor_max_us"] = max(row["gemms_us"], row["attention_us"])
            row["serial_over_overlap"] = row["serial_us"] / row["overlap_us"]
            rows.append(row)
            print(json.dumps(row), flush=True)
        del caches
        torch.cuda.empty_cache()
    with open(out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "layers": LAYERS,
                   "rows": rows}, f, indent=1)
    print("\nbatch  ctx  kv    serial  halves  overlap  gemms  attn   serial/overlap  (us a layer)")
    for r in rows:
        print(f"{r['batch']:>5} {r['context']:>4}  {r['kv']:<4} {r['serial_us']:7.1f} {r['halves_us']:7.1f} "
              f"{r['overlap_us']:8.1f} {r['gemms_us']:6.1f} {r['attention_us']:6.1f}   {r['serial_over_overlap']:.3f}")


if __name__ == "__main__":
    main()
