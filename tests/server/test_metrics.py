"""ServerMetrics and RequestTimer: what one request adds to the counters and histograms (on a fake
clock), Prometheus text that parses, one registry per app; the engine's gauges over HTTP."""

import time
from types import SimpleNamespace

import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from graphllm.runtime.outputs import CompletionOutput, RequestOutput
from graphllm.server import metrics as metrics_module
from graphllm.server.metrics import ServerMetrics
from tests.server.conftest import MODEL

PROMPT = [5, 6, 7]


@pytest.fixture
def clock(monkeypatch):
    """The metrics module's perf_counter, set by the test: clock.now = seconds."""
    clock = SimpleNamespace(now=0.0)
    monkeypatch.setattr(metrics_module, "time", SimpleNamespace(perf_counter=lambda: clock.now))
    return clock


@pytest.fixture
def metrics(engine) -> ServerMetrics:
    return ServerMetrics(engine)


def output(*seqs: tuple[int, str | None]) -> RequestOutput:
    """One RequestOutput with a CompletionOutput per (number of tokens, finish reason)."""
    outs = [CompletionOutput(i, "", list(range(n)), None, reason) for i, (n, reason) in enumerate(seqs)]
    return RequestOutput("r", None, PROMPT, outs, all(reason for _, reason in seqs))


def value(metrics: ServerMetrics, name: str, **labels) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def latencies(metrics: ServerMetrics, name: str) -> tuple[float, float]:
    """(count, sum) of a histogram."""
    return value(metrics, f"graphllm:{name}_count"), value(metrics, f"graphllm:{name}_sum")


def test_first_token_is_timed_once_then_each_output_at_its_per_token_latency(metrics, clock):
    timer = metrics.start_request()  # arrival at 0
    for clock.now, tokens in [(0.5, 1), (0.7, 2), (0.8, 2), (1.0, 5)]:
        timer.on_output(output((tokens, None)))
    assert latencies(metrics, "time_to_first_token_seconds") == (1, 0.5)
    count, total = latencies(metrics, "inter_token_latency_seconds")
    # 0.5 -> 0.7: one token in 0.2 s; 0.8 brought none; 0.7 -> 1.0: three tokens in one output, 0.1 s each
    assert count == 2 and total == pytest.approx(0.2 + 0.1)
    assert value(metrics, "graphllm:generation_tokens_total") == 5


def test_inter_token_latency_is_per_sequence(metrics, clock):
    timer = metrics.start_request()
    clock.now = 0.4
    timer.on_output(output((1, None), (1, None)))
    clock.now = 0.6
    timer.on_output(output((2, None), (2, None)))  # each sequence got its second token 0.2 s after its first
    assert latencies(metrics, "time_to_first_token_seconds") == (1, 0.4)
    assert latencies(metrics, "inter_token_latency_seconds") == (1, pytest.approx(0.2))
    assert value(metrics, "graphllm:generation_tokens_total") == 4


def test_inter_token_latency_counts_only_sequences_still_generating(metrics, clock):
    timer = metrics.start_request()
    clock.now = 0.4
    timer.on_output(output((1, None), (1, None)))
    clock.now = 0.6
    timer.on_output(output((2, "stop"), (2, None)))
    clock.now = 0.7
    timer.on_output(output((2, "stop"), (3, None)))  # sequence 1 alone: its next token 0.1 s later
    assert latencies(metrics, "inter_token_latency_seconds") == (2, pytest.approx(0.2 + 0.1))


def test_finish_counts_prompt_tokens_and_each_sequences_reason(metrics):
    metrics.start_request().finish(output((4, "length")), len(PROMPT), n=1)
    metrics.start_request().finish(output((2, "stop"), (1, None)), len(PROMPT), n=3)  # 1 stopped, 2 never finished
    metrics.start_request().finish(None, 10, n=2)  # gone before its first output
    assert value(metrics, "graphllm:prompt_tokens_total") == 3 + 3 + 10
    finished = {reason: value(metrics, "graphllm:sequences_finished_total", finish_reason=reason)
                for reason in ("length", "stop", "abort")}
    assert finished == {"length": 1, "stop": 1, "abort": 4}


def test_render_is_prometheus_text(metrics, clock):
    metrics.observe_http("/v1/completions", 200)
    metrics.observe_http("/v1/completions", 499)
    timer = metrics.start_request()
    for clock.now, tokens in [(0.03, 1), (0.05, 2)]:
        timer.on_output(output((tokens, "length" if tokens == 2 else None)))
    timer.finish(output((2, "length")), len(PROMPT), n=1)
    families = {f.name: f for f in text_string_to_metric_families(metrics.render().decode())}
    kinds = {name: f.type for name, f in families.items() if not name.endswith("_created")}  # creation times
    assert kinds == {"graphllm:http_requests": "counter", "graphllm:prompt_tokens": "counter",
                     "graphllm:generation_tokens": "counter", "graphllm:sequences_finished": "counter",
                     "graphllm:time_to_first_token_seconds": "histogram",
                     "graphllm:inter_token_latency_seconds": "histogram",
                     "graphllm:num_requests_running": "gauge", "graphllm:num_requests_waiting": "gauge",
                     "graphllm:kv_cache_usage_perc": "gauge", "graphllm:kv_cache_free_blocks": "gauge",
                     "graphllm:kv_cache_total_blocks": "gauge", "graphllm:prefix_cache_queries": "counter",
                     "graphllm:prefix_cache_hits": "counter"}
    http = {(s.labels["endpoint"], s.labels["status"]): s.value
            for s in families["graphllm:http_requests"].samples if s.name.endswith("_total")}
    assert http == {("/v1/completions", "200"): 1, ("/v1/completions", "499"): 1}
    buckets = [(float(s.labels["le"]), s.value) for s in families["graphllm:time_to_first_token_seconds"].samples
               if s.name.endswith("_bucket")]
    assert [n for le, n in buckets] == [0 if le < 0.03 else 1 for le, _ in buckets]  # 0.03 s: the 0.04 bucket on
    assert buckets[-1][0] == float("inf")


def test_two_servers_in_one_process_keep_their_own_counts(engine):
    first, second = ServerMetrics(engine), ServerMetrics(engine)  # a shared registry would refuse the second
    first.start_request().finish(None, 7, n=1)
    assert value(first, "graphllm:prompt_tokens_total") == 7
    assert value(second, "graphllm:prompt_tokens_total") == 0
    assert REGISTRY.get_sample_value("graphllm:prompt_tokens_total") is None  # not the process-wide one


# -- the engine's gauges, through a real server -----------------------------------------------


def idle(m: dict[str, float]) -> bool:
    return (m["graphllm:num_requests_running"] == 0 and m["graphllm:num_requests_waiting"] == 0
            and m["graphllm:kv_cache_free_blocks"] == m["graphllm:kv_cache_total_blocks"])


def test_gauges_show_a_running_request_and_all_blocks_free_once_it_finished(server, client):
    stream = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=800, stream=True,
                                       extra_body={"ignore_eos": True})
    next(iter(stream))
    during = server.metrics()
    stream.close()  # the disconnect aborts the request
    assert during["graphllm:num_requests_running"] == 1 and during["graphllm:num_requests_waiting"] == 0
    assert 0 < during["graphllm:kv_cache_free_blocks"] < during["graphllm:kv_cache_total_blocks"]
    assert during["graphllm:kv_cache_usage_perc"] > 0
    deadline = time.monotonic() + 10
    while not idle(server.metrics()):  # the abort lands when the server notices the disconnect
        assert time.monotonic() < deadline, "the aborted request still holds the engine"
        time.sleep(0.05)

    client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, extra_body={"ignore_eos": True})
    after = server.metrics()  # a finished request holds nothing, at once
    assert idle(after) and after["graphllm:kv_cache_usage_perc"] == 0
    assert after["graphllm:kv_cache_total_blocks"] == server.engine.state.num_kv_blocks


def test_prefix_cache_hits_reach_usage_and_metrics_and_the_reset_endpoint_clears_them(server, client):
    """Two requests sharing a 40-token prefix: the second reports cached tokens in usage (streamed too) and
    the counters move; after POST /reset_prefix_cache the same prompt finds nothing cached."""
    block = server.engine.pool.block_size
    shared = [5 + i % 50 for i in range(3 * block)]
    before = server.metrics()
    first = client.completions.create(model=MODEL, prompt=shared + [1], max_tokens=2)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    second = client.completions.create(model=MODEL, prompt=shared + [2], max_tokens=2)
    assert second.usage.prompt_tokens_details.cached_tokens == 3 * block
    stream = client.completions.create(model=MODEL, prompt=shared + [3], max_tokens=2, stream=True,
                                       stream_options={"include_usage": True})
    [last] = [chunk for chunk in stream if chunk.usage is not None]
    assert last.usage.prompt_tokens_details.cached_tokens == 3 * block
    after = server.metrics()
    assert after["graphllm:prefix_cache_hits_total"] - before["graphllm:prefix_cache_hits_total"] == 6 * block
    assert after["graphllm:prefix_cache_queries_total"] - before["graphllm:prefix_cache_queries_total"] == 3 * (
        3 * block + 1)
    reset = server.post("/reset_prefix_cache", {})
    assert reset.status_code == 200 and reset.json()["num_blocks_forgotten"] >= 3
    again = client.completions.create(model=MODEL, prompt=shared + [2], max_tokens=2)
    assert again.usage.prompt_tokens_details.cached_tokens == 0
