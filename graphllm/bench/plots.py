"""PNG plots of `bench latency` and `bench throughput` reports (matplotlib, no pyplot)."""

from graphllm.bench import serve_bench
from graphllm.bench.workload import PARTS

PART_COLORS = dict(zip(PARTS, ("tab:gray", "tab:blue", "tab:orange", "tab:olive")))


def require_matplotlib():
    """(Figure, LogFormatter); a message naming --plot when matplotlib is missing."""
    try:
        return serve_bench.load_matplotlib()
    except serve_bench.BenchError:
        raise ValueError("--plot needs matplotlib: pip install matplotlib") from None


def stacked_parts(ax, labels: list[str], breakdowns: list[dict | None]) -> None:
    """One bar per label, its height the mean step in ms, split into the step's parts."""
    bottoms = [0.0] * len(labels)
    for part in PARTS:
        heights = [(d or {}).get(f"{part}_ms", 0.0) for d in breakdowns]
        ax.bar(labels, heights, bottom=bottoms, color=PART_COLORS[part], label=part)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    ax.set_ylabel("ms per step")
    ax.legend()


def plot_latency(report: dict, path: str) -> None:
    Figure, _ = require_matplotlib()
    results = report["results"]
    xs = [r["batch_size"] for r in results]
    fig = Figure(figsize=(12, 4.5))
    speed, parts = fig.subplots(1, 2)
    nan = lambda v: float("nan") if v is None else v  # noqa: E731
    speed.plot(xs, [nan(r["decode_tok_s_per_seq"]) for r in results], "o-", color="tab:blue", label="per sequence")
    speed.plot(xs, [nan(r["decode_tok_s"]) for r in results], "s-", color="tab:green", label="aggregate")
    if any("transformers" in r for r in results):
        hf = [r.get("transformers") or {} for r in results]
        speed.plot(xs, [nan(h.get("decode_tok_s_per_seq")) for h in hf], "x:", color="tab:blue",
                   label="transformers per sequence")
        speed.plot(xs, [nan(h.get("decode_tok_s")) for h in hf], "x:", color="tab:green",
                   label="transformers aggregate")
    ceiling = report["ceiling"]["tok_s_per_seq"]
    if ceiling:
        speed.axhline(ceiling, color="tab:red", label=f"weight-read ceiling per sequence ({ceiling:.0f})")
        speed.plot(xs, [b * ceiling for b in xs], "--", color="tab:red", label="ceiling x batch (no KV reads)")
    speed.set_xscale("log", base=2)
    speed.set_xticks(xs, [str(x) for x in xs])
    speed.set_yscale("log")
    speed.set_xlabel("batch size")
    speed.set_ylabel("decode tokens/s")
    speed.set_title("decode speed")
    speed.legend(fontsize=8)
    stacked_parts(parts, [str(x) for x in xs], [r["step_breakdown_ms"].get("decode") for r in results])
    parts.set_xlabel("batch size")
    parts.set_title("mean decode step")
    e = report["engine"]
    fig.suptitle(f"graphllm bench latency: {e['device']}, {e['dtype']}, input {report['args']['input_len']}, "
                 f"output {report['args']['output_len']}, {'compiled' if e['compiled'] else 'eager'}"
                 f"{' + CUDA graphs' if e['cuda_graphs'] else ''}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_throughput(report: dict, path: str) -> None:
    Figure, _ = require_matplotlib()
    runs = [("engine", report["ours"])]
    if "ours_on_compared" in report:
        runs.append((f"engine, first {report['ours_on_compared']['num_requests']}", report["ours_on_compared"]))
    if "transformers" in report:
        runs.append((f"transformers, first {report['transformers']['num_requests']}", report["transformers"]))
    fig = Figure(figsize=(12, 4.5))
    bars, parts = fig.subplots(1, 2)
    width = 0.8 / len(runs)
    for i, (name, run) in enumerate(runs):
        xs = [j + (i - (len(runs) - 1) / 2) * width for j in range(2)]
        bars.bar(xs, [run["output_tok_s"], run["total_tok_s"]], width, label=name)
    bars.set_xticks([0, 1], ["output tok/s", "total (input + output) tok/s"])
    bars.set_ylabel("tokens/s")
    bars.set_title("throughput" + (f" (ours / transformers: {report['ratio']['output_tok_s']:.2f}x output tok/s)"
                                   if report.get("ratio", {}).get("output_tok_s") else ""))
    bars.legend()
    phases = report["ours"]["step_breakdown_ms"]
    stacked_parts(parts, [f"{p} ({d['steps']} steps)" for p, d in phases.items()], list(phases.values()))
    parts.set_title("engine: mean step")
    e = report["engine"]
    a = report["args"]
    fig.suptitle(f"graphllm bench throughput: {e['device']}, {e['dtype']}, {a['num_requests']} requests, "
                 f"lengths {a['min_len']}-{a['max_len']}, max_num_seqs {e['max_num_seqs']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
