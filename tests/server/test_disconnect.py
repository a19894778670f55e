"""Continuous batching across HTTP clients, and clients that leave mid-stream."""

import asyncio
import time

import httpx2 as httpx
import pytest

from tests.server.conftest import MODEL

NUM_CLIENTS, SHORT = 32, 8
FINISHED = 'graphllm:sequences_finished_total{{finish_reason="{}"}}'


def test_32_streams_with_a_quarter_disconnecting_early(server):
    """The leavers ask for nearly max_model_len tokens: only an abort frees their blocks in time."""
    long = server.engine.state.max_model_len - 64
    before = server.metrics()

    async def clients():
        client = server.async_client()

        async def stream(i: int):
            leaves = i % 4 == 0
            chunks = await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": f"What is {i} plus 3?"}], temperature=0,
                max_tokens=long if leaves else SHORT, stream=True, extra_body={"ignore_eos": True})
            seen, finish_reason, text = 0, None, ""
            async for chunk in chunks:
                seen += 1
                text += chunk.choices[0].delta.content or ""
                finish_reason = chunk.choices[0].finish_reason or finish_reason
                if leaves and seen == 3:  # role chunk + two tokens: mid-generation, blocks held
                    break
            await chunks.close()
            return leaves, seen, finish_reason, text

        try:
            return await asyncio.gather(*(stream(i) for i in range(NUM_CLIENTS)))
        finally:
            await client.close()

    results = asyncio.run(clients())
    stayed = [r for r in results if not r[0]]
    left = [r for r in results if r[0]]
    assert len(stayed) == 24 and len(left) == 8
    assert all(finish_reason == "length" and text for _, _, finish_reason, text in stayed)
    assert all(seen == 3 and finish_reason is None for _, seen, finish_reason, _ in left)

    m = wait_until_idle(server)
    assert not server.engine.has_unfinished_requests()

    assert grew(m, before, FINISHED.format("abort")) == 8 and grew(m, before, FINISHED.format("length")) == 24
    assert grew(m, before, "graphllm:time_to_first_token_seconds_count") == NUM_CLIENTS


def test_a_non_streaming_client_that_leaves_aborts_its_request(server):
    def complete(max_tokens: int, timeout: float = 60):
        body = {"model": MODEL, "prompt": [5, 6, 7], "ignore_eos": True, "max_tokens": max_tokens}
        return server.post("/v1/completions", body, timeout=timeout)

    long, start = server.engine.state.max_model_len - 64, time.monotonic()
    complete(16)
    timeout = min(0.5, (time.monotonic() - start) / 16 * long / 4)  # well before it could finish
    before = server.metrics()
    with pytest.raises(httpx.ReadTimeout):
        complete(long, timeout)
    m = wait_until_idle(server)
    assert grew(m, before, FINISHED.format("abort")) == 1
    assert grew(m, before, 'graphllm:http_requests_total{endpoint="/v1/completions",status="499"}') == 1


def wait_until_idle(server, seconds: float = 5) -> dict[str, float]:
    """Poll /metrics until no request runs or waits and every KV block is back in the pool."""
    deadline = time.monotonic() + seconds  # far less than the aborted requests' max_tokens would take
    while True:
        m = server.metrics()
        if (m["graphllm:num_requests_running"] == 0 and m["graphllm:num_requests_waiting"] == 0
                and m["graphllm:kv_cache_free_blocks"] == m["graphllm:kv_cache_total_blocks"]):
            assert m["graphllm:kv_cache_usage_perc"] == 0
            return m
        assert time.monotonic() < deadline, {k: v for k, v in m.items() if "num_requests" in k or "kv_" in k}
        time.sleep(0.05)


def grew(now: dict[str, float], before: dict[str, float], name: str) -> float:
    return now.get(name, 0) - before.get(name, 0)
