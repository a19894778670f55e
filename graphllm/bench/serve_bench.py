"""`graphllm bench serve`: load a running OpenAI-compatible server at several concurrency levels.

For each level, `--num-prompts` streaming requests go out through at most `concurrency` open
requests at a time (a closed loop: a worker sends its next request when its previous one ends).
The workload is synthetic and seeded: each prompt is `--input-len` random common English words
(about one token each for BPE tokenizers; the server's `usage.prompt_tokens` gives the real
count), asking for exactly `--output-len` tokens (`ignore_eos`). Every level gets its own prompts
so a prefix cache cannot reuse an earlier level's work.

Measured from the client side, per request: time to first token (TTFT), the gaps between
token-bearing SSE chunks (inter-token latency, ITL; a chunk that carries several tokens counts as
one gap) and end-to-end latency. Per level: request and output-token throughput, p50/p99 of each
latency, errors. Only `--base-url` is ever contacted: no proxies from the environment, no redirects.
"""

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from math import floor
from pathlib import Path

WORDS = tuple("""
the of and to in is it you that he was for on are as with his they at be this have from or one
had by word but not what all were we when your can said there use an each which she do how their
if will up other about out many then them these so some her would make like him into time has look
two more write go see number no way could people my than first water been call who oil its now find
long down day did get come made may part over new sound take only little work know place year live
me back give most very after thing our just name good sentence man think say great where help
through much before line right too mean old any same tell boy follow came want show also around
form three small set put end does another well large must big even such because turn here why ask
went men read need land different home us move try kind hand picture again change off play spell
air away animal house point page letter mother answer found study still learn should world high
""".split())
MAX_CONNECTIONS = 1000  # the openai client's default connection pool; more would queue inside the client


class BenchError(Exception):
    """The benchmark cannot run at all (server unreachable, no model, failed warm-up)."""


@dataclass(frozen=True)
class ServeBenchConfig:
    base_url: str = "http://127.0.0.1:8000/v1"
    model: str | None = None  # None: the first model the server lists
    api_key: str | None = None
    endpoint: str = "completions"
    concurrency: tuple[int, ...] = (1, 4, 16)
    num_prompts: int = 64
    input_len: int = 128
    output_len: int = 128
    seed: int = 0
    request_timeout: float = 300.0  # seconds, whole request including the stream
    num_warmups: int = 1
    out_json: str | None = None
    out_png: str | None = None

    def __post_init__(self):
        if self.endpoint not in ("completions", "chat"):
            raise ValueError(f"--endpoint must be completions or chat, not {self.endpoint!r}")
        if not self.concurrency or min(self.concurrency) < 1 or max(self.concurrency) > MAX_CONNECTIONS:
            raise ValueError(f"--concurrency levels must be between 1 and {MAX_CONNECTIONS}")
        for name in ("num_prompts", "input_len", "output_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
        if self.request_timeout <= 0 or self.num_warmups < 0:
            raise ValueError("--request-timeout must be positive and --num-warmups not negative")


@dataclass
class RequestResult:
    """One request's client-side timings, in seconds; `start_s` is relative to its level's start."""
    index: int
    prompt_words: int
    start_s: float = 0.0
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    e2e_s: float | None = None
    output_tokens: int = 0  # usage.completion_tokens when the server reports it, else token-bearing chunks
    chunks: int = 0  # token-bearing SSE chunks received
    prompt_tokens: int | None = None
    error: str | None = None


def make_prompts(seed: int, concurrency: int, num_prompts: int, input_len: int) -> list[str]:
    rng = random.Random(f"{seed}:{concurrency}")  # str seeds are stable across processes
    return [" ".join(rng.choice(WORDS) for _ in range(input_len)) for _ in range(num_prompts)]


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    lo = floor(rank)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


def make_client(config: ServeBenchConfig):
    try:
        from openai import AsyncOpenAI, DefaultAsyncHttpxClient
    except ImportError as e:
        raise BenchError("graphllm bench serve needs the openai client: pip install openai") from e
    # trust_env=False: no proxy from the environment; follow_redirects=False: never leave --base-url
    http = DefaultAsyncHttpxClient(trust_env=False, follow_redirects=False, timeout=config.request_timeout)
    return AsyncOpenAI(base_url=config.base_url, api_key=config.api_key or "EMPTY", max_retries=0,
                       timeout=config.request_timeout, http_client=http)


async def open_stream(client, config: ServeBenchConfig, model: str, prompt: str):
    common = dict(model=model, max_tokens=config.output_len, temperature=0.0, stream=True,
                  stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    if config.endpoint == "chat":
        return await client.chat.completions.create(messages=[{"role": "user", "content": prompt}], **common)
    return await client.completions.create(prompt=prompt, **common)


def chunk_text(chunk, endpoint: str) -> str:
    if not chunk.choices:
        return ""
    if endpoint == "completions":
        return chunk.choices[0].text or ""
    delta = chunk.choices[0].delta  # the first chat chunk carries only the role: not a token
    return (delta.content or "") + (getattr(delta, "reasoning_content", None) or "")


async def stream_request(client, config: ServeBenchConfig, model: str, prompt: str, result: RequestResult) -> None:
    start = time.perf_counter()
    last = None
    stream = await open_stream(client, config, model, prompt)
    async with stream:  # leaving early (timeout) closes the connection, so the server can abort
        async for chunk in stream:
            now = time.perf_counter()
            if chunk.usage is not None:
                result.prompt_tokens = chunk.usage.prompt_tokens
                result.output_tokens = chunk.usage.completion_tokens
            if not chunk_text(chunk, config.endpoint):
                continue
            if last is None:
                result.ttft_s = now - start
            else:
                result.itl_s.append(now - last)
            last = now
            result.chunks += 1
    result.e2e_s = time.perf_counter() - start
    if result.chunks == 0:
        raise BenchError("stream ended without a token")
    result.output_tokens = result.output_tokens or result.chunks


async def timed_request(client, config: ServeBenchConfig, model: str, prompt: str, result: RequestResult) -> None:
    """Run one request within `request_timeout`; any failure is recorded on `result`, never raised."""
    try:
        await asyncio.wait_for(stream_request(client, config, model, prompt, result), config.request_timeout)
    except asyncio.TimeoutError:
        result.error = f"timeout after {config.request_timeout:g}s"
    except Exception as e:  # a benchmark counts failures (HTTP errors, dropped streams) and goes on
        result.error = f"{type(e).__name__}: {e}"


async def run_level(client, config: ServeBenchConfig, model: str, concurrency: int) -> dict:
    prompts = make_prompts(config.seed, concurrency, config.num_prompts, config.input_len)
    results = [RequestResult(index=i, prompt_words=config.input_len) for i in range(len(prompts))]
    pending = iter(zip(results, prompts))  # shared by the workers: each request is taken exactly once
    level_start = time.perf_counter()

    async def worker():
        for result, prompt in pending:
            result.start_s = time.perf_counter() - level_start
            await timed_request(client, config, model, prompt, result)

    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(prompts)))))
    duration = time.perf_counter() - level_start
    return {"concurrency": concurrency, "summary": summarize(results, duration),
            "requests": [asdict(r) for r in results]}


def summarize(results: list[RequestResult], duration: float) -> dict:
    done = [r for r in results if r.error is None]
    ms = lambda values, q: None if not values else percentile(values, q) * 1000  # noqa: E731
    latencies = {"ttft": [r.ttft_s for r in done], "itl": [g for r in done for g in r.itl_s],
                 "e2e": [r.e2e_s for r in done]}
    summary = {"requests": len(results), "completed": len(done), "errors": len(results) - len(done),
               "duration_s": duration, "request_throughput": len(done) / duration,
               "output_throughput": sum(r.output_tokens for r in done) / duration,
               "mean_output_tokens": sum(r.output_tokens for r in done) / len(done) if done else None}
    for name, values in latencies.items():
        summary[f"{name}_ms_mean"] = sum(values) / len(values) * 1000 if values else None
        summary[f"{name}_ms_p50"] = ms(values, 50)
        summary[f"{name}_ms_p99"] = ms(values, 99)
    return summary


async def first_model(client) -> str:
    models = (await client.models.list()).data
    if not models:
        raise BenchError("the server lists no models: pass --model")
    return models[0].id


async def warm_up(client, config: ServeBenchConfig, model: str) -> None:
    for i in range(config.num_warmups):
        result = RequestResult(index=i, prompt_words=config.input_len)
        prompt = make_prompts(config.seed, 0, 1, config.input_len)[0]  # level "0": no level's prompts
        await timed_request(client, config, model, prompt, result)
        if result.error:
            raise BenchError(f"warm-up request failed: {result.error}")


async def run_bench(config: ServeBenchConfig) -> dict:
    client = make_client(config)
    async with client:
        try:
            model = config.model or await first_model(client)
        except Exception as e:  # connection refused, 401, ...: nothing to measure
            raise BenchError(f"cannot list models at {config.base_url}: {type(e).__name__}: {e}") from e
        await warm_up(client, config, model)
        levels = [await run_level(client, config, model, c) for c in config.concurrency]
    return {"config": {**asdict(config), "api_key": None}, "model": model, "levels": levels}


def format_table(levels: list[dict]) -> str:
    def pair(s, name):
        p50, p99 = s[f"{name}_ms_p50"], s[f"{name}_ms_p99"]
        return "-" if p50 is None else f"{p50:.1f}/{p99:.1f}"

    rows = [("conc", "reqs", "errors", "req/s", "out tok/s", "TTFT p50/p99 ms", "ITL p50/p99 ms", "E2E p50/p99 ms")]
    for level in levels:
        s = level["summary"]
        rows.append((str(level["concurrency"]), str(s["requests"]), str(s["errors"]), f"{s['request_throughput']:.2f}",
                     f"{s['output_throughput']:.1f}", pair(s, "ttft"), pair(s, "itl"), pair(s, "e2e")))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in rows)


def load_matplotlib():
    """(Figure, LogFormatter), imported only when a plot is asked for."""
    try:
        from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global figure state
        from matplotlib.ticker import LogFormatter
    except ImportError as e:
        raise BenchError("--out-png needs matplotlib: pip install 'graphllm[bench]' (or pip install matplotlib)") from e
    return Figure, LogFormatter


def write_plot(report: dict, path: str) -> None:
    levels = report["levels"]
    xs = [level["concurrency"] for level in levels]
    col = lambda key: [level["summary"][key] for level in levels]  # noqa: E731
    Figure, LogFormatter = load_matplotlib()
    fig = Figure(figsize=(11, 4.2))
    tput, lat = fig.subplots(1, 2)
    tput.plot(xs, col("output_throughput"), "o-", color="tab:blue", label="output tok/s")
    tput.set_ylabel("output tokens/s")
    reqs = tput.twinx()
    reqs.plot(xs, col("request_throughput"), "s--", color="tab:orange", label="requests/s")
    reqs.set_ylabel("requests/s")
    tput.set_title("throughput")
    tput.legend(handles=tput.get_lines() + reqs.get_lines(), loc="upper left")
    for name, color in (("ttft", "tab:green"), ("itl", "tab:purple")):
        for q, style in (("p50", "o-"), ("p99", "^--")):
            ys = [float("nan") if y is None else y for y in col(f"{name}_ms_{q}")]  # None: every request failed
            lat.plot(xs, ys, style, color=color, label=f"{name.upper()} {q}")
    lat.set_ylabel("milliseconds")
    if any(level["summary"]["completed"] for level in levels):
        lat.set_yscale("log")  # a log axis needs at least one positive value
        lat.yaxis.set_major_formatter(LogFormatter())  # 60, not 6 x 10^1; minor labels thinned as usual
        lat.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False))
    lat.set_title("latency")
    lat.legend()
    for ax in (tput, lat):
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_xlabel("concurrency")
    fig.suptitle(f"graphllm bench serve: {report['model']}, /{report['config']['endpoint']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def parse_levels(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register `serve` under `graphllm bench`."""
    p = subparsers.add_parser("serve", help="load a running OpenAI-compatible server at several concurrency levels")
    p.add_argument("--base-url", default=ServeBenchConfig.base_url)
    p.add_argument("--model", help="served model name (default: the first one /v1/models lists)")
    p.add_argument("--api-key", help="bearer token the server expects")
    p.add_argument("--endpoint", default="completions", choices=["completions", "chat"])
    p.add_argument("--concurrency", type=parse_levels, default=ServeBenchConfig.concurrency, help="e.g. 1,4,16")
    p.add_argument("--num-prompts", type=int, default=ServeBenchConfig.num_prompts, help="requests per level")
    p.add_argument("--input-len", type=int, default=ServeBenchConfig.input_len, help="words per prompt")
    p.add_argument("--output-len", type=int, default=ServeBenchConfig.output_len, help="max_tokens, with ignore_eos")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--request-timeout", type=float, default=ServeBenchConfig.request_timeout, help="seconds")
    p.add_argument("--num-warmups", type=int, default=1, help="unrecorded requests before the first level")
    p.add_argument("--out-json", help="write the summary and every request's timings here")
    p.add_argument("--out-png", help="plot throughput and TTFT/ITL p50/p99 against concurrency here")
    p.set_defaults(func=main)
    return p


def config_from_args(args: argparse.Namespace) -> ServeBenchConfig:
    return ServeBenchConfig(
        base_url=args.base_url, model=args.model, api_key=args.api_key, endpoint=args.endpoint,
        concurrency=tuple(args.concurrency), num_prompts=args.num_prompts, input_len=args.input_len,
        output_len=args.output_len, seed=args.seed, request_timeout=args.request_timeout,
        num_warmups=args.num_warmups, out_json=args.out_json, out_png=args.out_png)


def main(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    try:
        if config.out_png:
            load_matplotlib()  # fail before a long run, not after it
        report = asyncio.run(run_bench(config))
    except BenchError as e:
        print(f"graphllm bench serve: error: {e}", file=sys.stderr)
        return 1
    print(format_table(report["levels"]))
    if config.out_json:
        Path(config.out_json).parent.mkdir(parents=True, exist_ok=True)
        Path(config.out_json).write_text(json.dumps(report, indent=1))
    if config.out_png:
        Path(config.out_png).parent.mkdir(parents=True, exist_ok=True)
        write_plot(report, config.out_png)
    return 0 if any(level["summary"]["completed"] for level in report["levels"]) else 1
