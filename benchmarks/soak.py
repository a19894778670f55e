"""Soak test (issue 17): many clients against a real `graphllm serve` on 127.0.0.1, for a while.

Each client loops until --duration ends: chat or text completion, mostly streaming, a random short
prompt and max_tokens. With probability --abort-rate it gives up after a random timeout of at most
--abort-after seconds (the httpx timeout and a deadline on the whole request); else a stream, with
probability --disconnect-rate, is closed after a random number of chunks. Every request ends in
one of OUTCOMES. After the load, and only then, /metrics is polled until no request runs or waits
and every KV block is free. The server's RSS (VmRSS of a local PID) is read after a warm-up, every
few seconds, and at the end. Retries are off: they would hide the connection errors and 5xx this
looks for. Only 127.0.0.1 / localhost is ever contacted.

    python3 benchmarks/soak.py --base-url http://127.0.0.1:8000/v1 --clients 256 --duration 600 \\
        --disconnect-rate 0.2 --abort-rate 0.1 --max-tokens 64 --server-pid PID --json soak.json
    python3 benchmarks/soak.py --clients 32 --duration 60 --json soak.json --serve --eager
        # --serve: starts `graphllm serve [the flags after --serve]` itself, SIGTERM at the end
"""

import argparse
import asyncio
import dataclasses
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx2 as httpx  # the HTTP client the openai package ships with
import openai

from graphllm.bench.serve_bench import WORDS

LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost"})
OUTCOMES = ("completed", "disconnected", "aborted", "http_4xx", "http_5xx", "connection_error", "stream_error",
            "timed_out", "client_error")
MAX_REQUESTS_PER_CLIENT = 1_000_000  # a count bound besides the time bound
KEPT_ERRORS = 20  # details kept per outcome
LOG_PROBLEM = re.compile(r"\b(ERROR|CRITICAL|WARNING)\b|Traceback|Exception")


@dataclass(frozen=True)
class SoakConfig:
    base_url: str  # http://127.0.0.1:PORT/v1
    clients: int = 32
    duration: float = 60.0  # seconds of load; requests in flight then still finish
    disconnect_rate: float = 0.2  # of streams
    abort_rate: float = 0.1
    stream_rate: float = 0.85
    chat_rate: float = 0.5  # of requests; 0 for a model without a chat template (the bench presets)
    token_prompts: bool = False  # text completions send token ids (the bench presets have no tokenizer)
    max_tokens: int = 64
    abort_after: float = 1.0  # an aborting client's timeout: uniform(0.01, this) seconds
    request_timeout: float = 120.0  # any other request taking longer counts as timed_out
    idle_timeout: float = 10.0  # how long the pool may take to drain after the load
    warmup_requests: int = 4
    rss_every: float = 5.0  # seconds between RSS samples
    api_key: str = "EMPTY"
    model: str = ""  # empty: the first the server lists
    seed: int = 0

    def __post_init__(self):
        parts = urlsplit(self.base_url)  # this workplace allows traffic to this machine only
        if parts.scheme not in ("http", "https") or parts.hostname not in LOCAL_HOSTS:
            raise ValueError(f"--base-url must be http://127.0.0.1:PORT/v1 or http://localhost:PORT/v1, "
                             f"not {self.base_url!r}")
        if not all(0 <= r <= 1 for r in (self.abort_rate, self.disconnect_rate, self.stream_rate, self.chat_rate)):
            raise ValueError("rates must lie in [0, 1]")
        if self.clients < 1 or self.max_tokens < 1 or self.duration <= 0:
            raise ValueError("--clients and --max-tokens must be at least 1, --duration positive")


@dataclass
class Attempt:
    """One request as its client plans it, and how far it got."""
    kind: str  # "chat" | "text"
    stream: bool
    plan: str  # "complete" | "disconnect" | "abort"
    params: dict
    timeout: float
    stop_after: int | None  # disconnect after this many chunks
    started: float = 0.0  # seconds since the load began
    chunks: int = 0
    finished: bool = False  # a finish_reason arrived


@dataclass
class Tally:
    outcomes: Counter = field(default_factory=Counter)
    by_kind: dict = field(default_factory=lambda: defaultdict(Counter))  # "chat stream" -> outcome counts
    errors: dict = field(default_factory=lambda: defaultdict(list))  # outcome -> its first KEPT_ERRORS

    def add(self, a: Attempt, outcome: str, error: BaseException | None, elapsed: float) -> None:
        self.outcomes[outcome] += 1
        self.by_kind[f"{a.kind} {'stream' if a.stream else 'plain'}"][outcome] += 1
        if outcome not in ("completed", "disconnected", "aborted") and len(self.errors[outcome]) < KEPT_ERRORS:
            self.errors[outcome].append({**dataclasses.asdict(a), "elapsed_s": round(elapsed, 3),
                                         "error": exception_chain(error), "status": getattr(error, "status_code", None),
                                         "body": getattr(error, "body", None)})


def plan_attempt(rng: random.Random, cfg: SoakConfig, model: str) -> Attempt:
    kind = "chat" if rng.random() < cfg.chat_rate else "text"
    stream, u = rng.random() < cfg.stream_rate, rng.random()
    plan = "abort" if u < cfg.abort_rate else "disconnect" if stream and u < cfg.abort_rate + cfg.disconnect_rate \
        else "complete"
    words = rng.randint(1, 12)
    prompt = ([rng.randrange(3, 256) for _ in range(words * 2)] if cfg.token_prompts and kind == "text"
              else " ".join(rng.choices(WORDS, k=words)))  # ids < 256: in the demo's vocabulary (398) and Llama's
    params = {"model": model, "max_tokens": rng.randint(1, cfg.max_tokens), "temperature": rng.choice((0.0, 0.8)),
              "extra_body": {"ignore_eos": rng.random() < 0.5}}
    params |= {"messages": [{"role": "user", "content": prompt}]} if kind == "chat" else {"prompt": prompt}
    timeout = rng.uniform(0.01, cfg.abort_after) if plan == "abort" else cfg.request_timeout
    stop_after = rng.randint(1, params["max_tokens"]) if plan == "disconnect" else None
    return Attempt(kind, stream, plan, params, timeout, stop_after)


async def send(client: openai.AsyncOpenAI, a: Attempt) -> str:
    """completed, disconnected, or stream_error when a 200 answer ends without a finish_reason."""
    create = client.chat.completions.create if a.kind == "chat" else client.completions.create
    response = await create(**a.params, stream=a.stream, timeout=a.timeout)
    if not a.stream:
        a.finished = bool(response.choices) and response.choices[0].finish_reason is not None
        return "completed" if a.finished else "stream_error"
    async with response:  # leaving early closes the connection: the server sees a disconnect
        async for chunk in response:
            a.chunks += 1
            a.finished = a.finished or bool(chunk.choices and chunk.choices[0].finish_reason)
            if a.chunks == a.stop_after:
                return "disconnected"
    return "completed" if a.finished else "stream_error"


def classify(e: BaseException, a: Attempt) -> str:
    """The outcome of a request that raised."""
    if isinstance(e, (asyncio.TimeoutError, openai.APITimeoutError, httpx.TimeoutException)):
        return "aborted" if a.plan == "abort" else "timed_out"
    if isinstance(e, openai.APIStatusError):
        return f"http_{e.status_code // 100}xx"
    if isinstance(e, (openai.APIConnectionError, httpx.TransportError)):
        return "connection_error"
    return "stream_error" if isinstance(e, openai.APIError) else "client_error"  # APIError: an error event


def exception_chain(e: BaseException | None) -> str | None:
    """'openai.APIConnectionError: ... <- httpx2.RemoteProtocolError: ...': a wrapper and what it wraps."""
    parts = []
    while e is not None and len(parts) < 6:
        parts.append(f"{type(e).__module__}.{type(e).__name__}: {e}")
        e = e.__cause__ or e.__context__
    return " <- ".join(parts) or None


async def client_loop(client: openai.AsyncOpenAI, cfg: SoakConfig, model: str, tally: Tally, start: float,
                      seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(MAX_REQUESTS_PER_CLIENT):
        if time.monotonic() >= start + cfg.duration:
            return
        a = plan_attempt(rng, cfg, model)
        a.started = round(time.monotonic() - start, 3)
        try:
            outcome, error = await asyncio.wait_for(send(client, a), a.timeout), None
        except Exception as e:  # every failure is an outcome to count, not a reason to stop
            outcome, error = classify(e, a), e
        tally.add(a, outcome, error, time.monotonic() - start - a.started)


async def drive(cfg: SoakConfig, pid: int | None) -> dict:
    """Warm up, read RSS, then all clients until the deadline and until their last requests end (bounded)."""
    # trust_env=False: no proxy from the environment; follow_redirects=False: never leave --base-url
    http = openai.DefaultAsyncHttpxClient(trust_env=False, follow_redirects=False, timeout=cfg.request_timeout)
    async with openai.AsyncOpenAI(base_url=cfg.base_url, api_key=cfg.api_key, max_retries=0,
                                  timeout=cfg.request_timeout, http_client=http) as client:
        model = await warm_up(client, cfg)
        run = {"model": model, "rss_start": rss_kb(pid), "samples": [], "tally": Tally(), "hung": False}
        start = time.monotonic()
        loops = [client_loop(client, cfg, model, run["tally"], start, cfg.seed * 100_003 + i)
                 for i in range(cfg.clients)]
        try:
            await asyncio.wait_for(asyncio.gather(sample_rss(cfg, pid, start, run["samples"]), *loops),
                                   cfg.duration + cfg.request_timeout + 30)
        except asyncio.TimeoutError:
            run["hung"] = True
    return {**run, "load_s": round(time.monotonic() - start, 2)}


async def warm_up(client: openai.AsyncOpenAI, cfg: SoakConfig) -> str:
    """A few whole requests, neither aborted nor disconnected; returns the model's name."""
    model, rng = cfg.model or (await client.models.list()).data[0].id, random.Random(-1)
    for _ in range(cfg.warmup_requests):
        await send(client, plan_attempt(rng, dataclasses.replace(cfg, abort_rate=0, disconnect_rate=0), model))
    return model


async def sample_rss(cfg: SoakConfig, pid: int | None, start: float, samples: list) -> None:
    while time.monotonic() < start + cfg.duration:
        samples.append((round(time.monotonic() - start, 1), rss_kb(pid)))
        await asyncio.sleep(cfg.rss_every)


def read_metrics(cfg: SoakConfig) -> dict[str, float]:
    """Every graphllm sample of /metrics but histogram buckets: `name{labels}` -> value."""
    text = httpx.get(cfg.base_url.rstrip("/").removesuffix("/v1") + "/metrics", timeout=10, trust_env=False,
                     headers={"Authorization": f"Bearer {cfg.api_key}"}).raise_for_status().text
    samples = (line.rsplit(" ", 1) for line in text.splitlines() if line.startswith("graphllm:"))
    return {key: float(value) for key, value in samples if "_bucket{" not in key and "_created" not in key}


def wait_idle(cfg: SoakConfig, poll: float = 0.1) -> dict:
    """Poll /metrics until running == waiting == 0 and free == total blocks, or cfg.idle_timeout."""
    names = ("num_requests_running", "num_requests_waiting", "kv_cache_free_blocks", "kv_cache_total_blocks")
    start = time.monotonic()
    for _ in range(int(cfg.idle_timeout / poll) + 1):
        m = read_metrics(cfg)
        running, waiting, free, total = (m[f"graphllm:{n}"] for n in names)
        if idle := running == waiting == 0 and free == total:
            break
        time.sleep(poll)
    return {"idle": idle, "after_s": round(time.monotonic() - start, 2), **{n: m[f"graphllm:{n}"] for n in names},
            "metrics": m}


def rss_kb(pid: int | None) -> dict | None:
    """VmRSS (now) and VmHWM (peak) of a local process, in KiB."""
    if pid is None:
        return None
    with open(f"/proc/{pid}/status") as f:
        return {k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in f) if k in ("VmRSS", "VmHWM")}


def run_soak(cfg: SoakConfig, pid: int | None = None) -> dict:
    """Warm up, drive the load, wait for the pool to drain; the server's RSS (a local `pid`) on the way."""
    run = asyncio.run(drive(cfg, pid))
    tally, idle, rss_end = run["tally"], wait_idle(cfg), rss_kb(pid)
    report = {"config": dataclasses.asdict(cfg), "model": run["model"], "load_s": run["load_s"], "hung": run["hung"],
              "requests": sum(tally.outcomes.values()), "outcomes": {o: tally.outcomes[o] for o in OUTCOMES},
              "by_kind": {k: dict(v) for k, v in tally.by_kind.items()}, "errors": dict(tally.errors),
              "idle": idle, "rss_kb": {"pid": pid}}
    if pid is not None:  # a leak grows in the second half too; a working set that settles once batches are full, not
        start, mid = run["rss_start"], next((kb for t, kb in run["samples"] if t >= cfg.duration / 2), rss_end)
        report["rss_kb"] |= {"start": start, "end": rss_end, "growth": rss_end["VmRSS"] - start["VmRSS"],
                             "second_half_growth": rss_end["VmRSS"] - mid["VmRSS"], "samples": run["samples"]}
    return report


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(cfg: SoakConfig, serve_args: list[str], log, timeout: float = 600) -> subprocess.Popen:
    """`python3 -m graphllm.cli serve` on cfg.base_url's port; returns once /health answers 200."""
    port = str(urlsplit(cfg.base_url).port)
    argv = [sys.executable, "-m", "graphllm.cli", "serve", "--host", "127.0.0.1", "--port", port, *serve_args]
    proc, deadline = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT), time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1, trust_env=False).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"server did not come up (exit code {proc.wait()}); see its log {log.name}")


def stop_server(proc: subprocess.Popen, timeout: float = 60) -> dict:
    """SIGTERM, then wait; SIGKILL (exit_code None) when it has not stopped within `timeout`."""
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        code = None
    return {"pid": proc.pid, "exit_code": code, "stop_s": round(time.monotonic() - start, 2)}


def soak_served(cfg: SoakConfig, serve_args: list[str], log_path: str) -> dict:
    """run_soak against a server of its own, stopped with SIGTERM at the end; its log's problems in the report."""
    if "--host" in serve_args or "--port" in serve_args:
        raise ValueError("--serve takes the port from --base-url and always serves on 127.0.0.1")
    with open(log_path, "w") as log:
        proc = start_server(cfg, serve_args, log)
        try:
            report = run_soak(cfg, proc.pid)
        finally:
            stopped = stop_server(proc)
    with open(log_path) as log:
        problems = [line.rstrip() for line in log if LOG_PROBLEM.search(line)]
    report["server"] = {**stopped, "argv": serve_args, "log": log_path, "num_log_problems": len(problems),
                        "log_problems": problems[:50]}
    return report


def print_table(r: dict) -> None:
    c, i, rss, sv = r["config"], r["idle"], r["rss_kb"], r.get("server")
    print(f"soak: {c['clients']} clients x {c['duration']:g} s: {r['requests']} requests in {r['load_s']} s"
          + ("  HUNG: stopped by the overall deadline" if r["hung"] else ""))
    for outcome in OUTCOMES:
        print(f"  {outcome:<17}{r['outcomes'][outcome]:>8}")
    print(f"  pool {'idle' if i['idle'] else 'NOT IDLE'} after {i['after_s']} s: running "
          f"{i['num_requests_running']:g}, waiting {i['num_requests_waiting']:g}, "
          f"free blocks {i['kv_cache_free_blocks']:g}/{i['kv_cache_total_blocks']:g}")
    if rss["pid"] is not None:
        print(f"  server RSS {rss['start']['VmRSS'] / 1024:.1f} MiB after warm-up -> {rss['end']['VmRSS'] / 1024:.1f}"
              f" MiB at end ({rss['growth'] / 1024:+.1f} MiB; {rss['second_half_growth'] / 1024:+.1f} MiB in the "
              f"second half), peak {rss['end']['VmHWM'] / 1024:.1f} MiB")
    if sv is not None:
        print(f"  server exit code {sv['exit_code']} {sv['stop_s']} s after SIGTERM; "
              f"{sv['num_log_problems']} error/warning lines in its log {sv['log']}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for f in dataclasses.fields(SoakConfig):  # --clients, --duration, ... with SoakConfig's defaults
        kind = str if f.name == "base_url" else (lambda v: v.lower() in ("1", "true", "yes")) \
            if isinstance(f.default, bool) else type(f.default)  # --token-prompts 1 / 0
        p.add_argument(f"--{f.name.replace('_', '-')}", type=kind, default=f.default if f.name != "base_url" else None)
    p.set_defaults(api_key=os.environ.get("GRAPHLLM_API_KEY", "EMPTY"))
    p.add_argument("--server-pid", type=int, help="the server's local PID, for its RSS")
    p.add_argument("--json", help="write the whole report here")
    p.add_argument("--server-log", default="soak-server.log", help="with --serve: the server's output")
    p.add_argument("--serve", nargs=argparse.REMAINDER, help="start `graphllm serve` with the flags that follow")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    options = {f.name: getattr(args, f.name) for f in dataclasses.fields(SoakConfig)}
    options["base_url"] = args.base_url or f"http://127.0.0.1:{8000 if args.serve is None else free_port()}/v1"
    try:  # a bad flag, a server that is down or refuses the key: one line, no traceback
        cfg = SoakConfig(**options)
        served = args.serve is not None  # `--serve` alone: the demo model, compiled
        report = soak_served(cfg, args.serve, args.server_log) if served else run_soak(cfg, args.server_pid)
    except (ValueError, openai.APIError, httpx.HTTPError, RuntimeError) as e:
        sys.exit(f"soak: error: {type(e).__name__}: {e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    print_table(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
