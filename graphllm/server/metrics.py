"""Prometheus metrics for `GET /metrics`, in vLLM's naming style (`graphllm:<name>`).

Counters and histograms are updated as requests run; the engine's gauges (running and waiting
requests, KV-cache blocks) are read from `EngineClient.stats()` when scraped. Each app has
its own registry, so several servers can live in one process (tests do).
"""

import time

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from graphllm.runtime.client import EngineClient
from graphllm.runtime.outputs import RequestOutput

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15,
               0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0)


class EngineCollector:
    """Gauges read at scrape time: no bookkeeping that could drift from the engine's own."""

    def __init__(self, engine: EngineClient):
        self.engine = engine

    def collect(self):
        stats = self.engine.stats()
        free, total = stats.num_free_blocks, stats.num_blocks
        yield _gauge("num_requests_running", "Requests with sequences in the running batch.",
                     stats.num_requests_running)
        yield _gauge("num_requests_waiting", "Requests waiting to be scheduled.", stats.num_requests_waiting)
        yield _gauge("kv_cache_usage_perc", "Fraction of KV-cache blocks in use (0..1).", 1 - free / total)
        yield _gauge("kv_cache_free_blocks", "KV-cache blocks free in the pool.", free)
        yield _gauge("kv_cache_total_blocks", "KV-cache blocks the pool holds.", total)
        yield CounterMetricFamily("graphllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                                  value=stats.prefix_cache_queries)
        yield CounterMetricFamily("graphllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.",
                                  value=stats.prefix_cache_hits)
        spec = getattr(stats, "spec_decode", None)
        if spec is not None:
            yield from spec_decode_metrics(spec)


def spec_decode_metrics(spec):
    """Speculative decoding's counters under vLLM's names (vllm:spec_decode_* -> graphllm:spec_decode_*)."""
    yield CounterMetricFamily("graphllm:spec_decode_num_drafts", "Verified proposals (one per sequence and step).",
                              value=spec.num_drafts)
    yield CounterMetricFamily("graphllm:spec_decode_num_draft_tokens", "Proposed tokens verified.",
                              value=spec.num_draft_tokens)
    yield CounterMetricFamily("graphllm:spec_decode_num_accepted_tokens", "Proposed tokens the target accepted.",
                              value=spec.num_accepted_tokens)
    per_position = CounterMetricFamily("graphllm:spec_decode_num_accepted_tokens_per_pos",
                                       "Accepted tokens by their position in the proposal.", labels=["position"])
    for position, count in enumerate(spec.accepted_per_position):
        per_position.add_metric([str(position)], count)
    yield per_position
    yield CounterMetricFamily("graphllm:spec_decode_draft_seconds", "Time spent proposing.", value=spec.draft_seconds)
    yield CounterMetricFamily("graphllm:spec_decode_verify_seconds", "Time spent in verify steps.",
                              value=spec.verify_seconds)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"graphllm:{name}", doc, value=value)


class ServerMetrics:
    def __init__(self, engine: EngineClient):
        self.registry = CollectorRegistry()
        r = self.registry
        self.http_requests = Counter("graphllm:http_requests", "HTTP requests by endpoint and status.",
                                     ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("graphllm:prompt_tokens", "Prompt tokens of finished requests.",
                                     registry=r)
        self.generation_tokens = Counter("graphllm:generation_tokens", "Tokens generated.", registry=r)
        self.finished = Counter("graphllm:sequences_finished", "Finished sequences by finish reason.",
                                ["finish_reason"], registry=r)
        self.ttft = Histogram("graphllm:time_to_first_token_seconds", "Arrival to first output token.",
                              buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram("graphllm:inter_token_latency_seconds", "Time between output tokens.",
                             buckets=ITL_BUCKETS, registry=r)
        r.register(EngineCollector(engine))

    def observe_http(self, endpoint: str, status: int) -> None:
        self.http_requests.labels(endpoint, str(status)).inc()

    def start_request(self) -> "RequestTimer":
        return RequestTimer(self)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class RequestTimer:
    """Follows one engine request: first-token and inter-token latencies, tokens, how it ended."""

    def __init__(self, metrics: ServerMetrics):
        self.metrics = metrics
        self.arrival = self.last = time.perf_counter()
        self.num_tokens = 0
        self.per_sequence: list[int] = []  # output tokens of each sequence so far

    def on_output(self, out: RequestOutput) -> None:
        counts = [len(c.token_ids) for c in out.outputs]
        num_tokens = sum(counts)
        new = num_tokens - self.num_tokens
        if new <= 0:
            return
        now = time.perf_counter()
        if self.num_tokens == 0:
            self.metrics.ttft.observe(now - self.arrival)
        else:  # per sequence: only those that advanced (a finished sibling adds no tokens)
            advanced = sum(c > before for c, before in zip(counts, self.per_sequence))
            self.metrics.itl.observe((now - self.last) / new * advanced)
        self.metrics.generation_tokens.inc(new)
        self.num_tokens, self.last, self.per_sequence = num_tokens, now, counts

    def finish(self, last: RequestOutput | None, num_prompt_tokens: int, n: int) -> None:
        """Count the request; sequences that never reported a finish reason were aborted."""
        self.metrics.prompt_tokens.inc(num_prompt_tokens)
        reasons = [c.finish_reason for c in last.outputs] if last is not None else []
        reasons += [None] * (n - len(reasons))
        for reason in reasons:
            self.metrics.finished.labels(reason or "abort").inc()
