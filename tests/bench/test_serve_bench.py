"""`graphllm bench serve` against a fake OpenAI-compatible streaming server on 127.0.0.1.

The fake server's timing is known: the first token comes `FIRST_DELAY` after the request arrives
(a chat stream's role-only chunk comes at once, so counting it as a token would show), then one
token every `TOKEN_GAP`. It sends `max_tokens - 2` tokens, so the client must count what arrived,
not what it asked for.
"""

import argparse
import asyncio
import json
import socket
import threading
import time

import numpy as np
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from graphllm.bench import serve_bench

MODEL = "fake-model"
FIRST_DELAY = 0.05
TOKEN_GAP = 0.02
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "fake", "param": None, "code": status}}, status)


def sse(payload: dict | str) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"


async def events(chat: bool, tokens: int, prompt_tokens: int, state: dict, drop: bool):
    kind = "chat.completion.chunk" if chat else "text_completion"
    head = {"id": "x", "object": kind, "created": 0, "model": MODEL}
    if chat:
        yield sse({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
    await asyncio.sleep(state.get("first_delay", FIRST_DELAY))
    for i in range(tokens):
        if drop and i == 2:
            raise RuntimeError("fake server drops the stream")  # uvicorn cuts the connection mid-body
        choice = {"index": 0, "delta": {"content": f" t{i}"}} if chat else {"index": 0, "text": f" t{i}"}
        yield sse({**head, "choices": [{**choice, "finish_reason": None}]})
        if i < tokens - 1:
            await asyncio.sleep(TOKEN_GAP)
    if state["usage"]:
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": tokens, "total_tokens": prompt_tokens + tokens}
        yield sse({**head, "choices": [], "usage": usage})
    yield sse("[DONE]")


def fake_app(state: dict) -> FastAPI:
    app = FastAPI()

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": MODEL, "object": "model", "created": 0, "owned_by": "test"}]}

    async def complete(request: Request, chat: bool):
        body = await request.json()
        state["count"] += 1
        n = state["count"]
        if body.get("model") != MODEL or body.get("ignore_eos") is not True or body.get("stream") is not True:
            return error(400, "expected model, ignore_eos and stream")
        if state["fail_every"] and n % state["fail_every"] == 0:
            return error(500, "fake internal error")
        prompt = body["messages"][-1]["content"] if chat else body["prompt"]
        state["prompts"].append(prompt)
        drop = bool(state["fail_every"]) and n % state["fail_every"] == 1
        stream = events(chat, max(1, body["max_tokens"] - 2), len(prompt.split()), state, drop)
        return StreamingResponse(stream, media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await complete(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await complete(request, chat=True)

    return app


@pytest.fixture(scope="module")
def server():
    """(base_url, state): the fake server, running in a thread for the whole module."""
    state = {}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = uvicorn.Config(fake_app(state), host="127.0.0.1", port=port, log_level="warning",
                            timeout_graceful_shutdown=1)
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not srv.started and time.monotonic() < deadline:
        time.sleep(0.01)
    assert srv.started, "fake server did not start"
    yield f"http://127.0.0.1:{port}/v1", state
    srv.should_exit = True
    thread.join(timeout=5)


@pytest.fixture
def fake(server):
    base_url, state = server
    state.clear()
    state.update(count=0, fail_every=0, usage=True, prompts=[])
    return base_url, state


def bench_args(base_url: str, tmp_path, *extra: str, png: bool = False) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve_bench.add_parser(parser.add_subparsers())
    plot = ["--out-png", str(tmp_path / "bench.png")] if png else []
    return parser.parse_args(["serve", "--base-url", base_url, "--num-prompts", "8", "--input-len", "12",
                              "--output-len", "8", "--num-warmups", "0", "--request-timeout", "10",
                              "--out-json", str(tmp_path / "bench.json"), *plot, *extra])


def run(base_url, tmp_path, *extra, png: bool = False) -> tuple[int, dict]:
    code = serve_bench.main(bench_args(base_url, tmp_path, *extra, png=png))
    return code, json.loads((tmp_path / "bench.json").read_text())


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_levels_requests_and_timings(fake, tmp_path, endpoint):
    base_url, state = fake
    code, report = run(base_url, tmp_path, "--concurrency", "1,4", "--endpoint", endpoint, png=True)
    assert code == 0
    assert report["model"] == MODEL  # taken from /v1/models: the server 400s any other name
    assert [level["concurrency"] for level in report["levels"]] == [1, 4]
    for level in report["levels"]:
        s, requests = level["summary"], level["requests"]
        assert sorted(r["index"] for r in requests) == list(range(8))
        assert s["requests"] == s["completed"] == 8 and s["errors"] == 0
        for r in requests:
            assert r["error"] is None
            assert r["output_tokens"] == r["chunks"] == 6  # what the server sent, not max_tokens=8
            assert r["prompt_tokens"] == 12
            assert r["ttft_s"] >= FIRST_DELAY
            assert len(r["itl_s"]) == 5
            assert r["e2e_s"] >= r["ttft_s"] + sum(r["itl_s"]) - 1e-6
        for name in ("ttft", "itl", "e2e"):
            assert s[f"{name}_ms_p50"] <= s[f"{name}_ms_p99"]
        assert s["ttft_ms_p50"] >= FIRST_DELAY * 1000
        assert TOKEN_GAP * 0.75 <= s["itl_ms_p50"] / 1000 <= TOKEN_GAP * 1.5
        assert s["output_throughput"] == pytest.approx(6 * 8 / s["duration_s"])
    one, four = (level["summary"] for level in report["levels"])
    assert four["request_throughput"] > 2 * one["request_throughput"]  # the fake server scales perfectly
    assert len(state["prompts"]) == 16 and len(set(state["prompts"])) == 16  # each level has its own prompts
    assert (tmp_path / "bench.png").read_bytes()[:8] == PNG_MAGIC


def test_prompts_are_seeded(fake, tmp_path):
    base_url, state = fake
    run(base_url, tmp_path, "--concurrency", "2", "--seed", "7")
    first = list(state["prompts"])
    state["prompts"].clear()
    run(base_url, tmp_path, "--concurrency", "2", "--seed", "7")
    assert sorted(state["prompts"]) == sorted(first)
    assert all(len(p.split()) == 12 for p in first)
    assert serve_bench.make_prompts(8, 2, 8, 12) != serve_bench.make_prompts(7, 2, 8, 12)


def test_chunks_counted_without_usage(fake, tmp_path):
    base_url, state = fake
    state["usage"] = False
    code, report = run(base_url, tmp_path, "--concurrency", "2")
    assert code == 0
    for r in report["levels"][0]["requests"]:
        assert r["output_tokens"] == r["chunks"] == 6 and r["prompt_tokens"] is None


def test_server_errors_are_counted(fake, tmp_path):
    base_url, state = fake
    state["fail_every"] = 4  # requests 4 and 8 answer 500; 1 and 5 drop their stream after two tokens
    code, report = run(base_url, tmp_path, "--concurrency", "2", png=True)
    assert code == 0
    s, requests = report["levels"][0]["summary"], report["levels"][0]["requests"]
    assert (s["requests"], s["completed"], s["errors"]) == (8, 4, 4)
    failed = [r["error"] for r in requests if r["error"]]
    assert sum("500" in e for e in failed) == 2
    assert sorted(r["chunks"] for r in requests if r["error"]) == [0, 0, 2, 2]  # partial streams kept in the raw data
    assert all(r["output_tokens"] == 6 for r in requests if r["error"] is None)
    assert s["output_throughput"] == pytest.approx(6 * 4 / s["duration_s"])  # failed requests add no tokens
    assert (tmp_path / "bench.png").read_bytes()[:8] == PNG_MAGIC


def test_request_timeout_is_an_error(fake, tmp_path):
    base_url, state = fake
    state["first_delay"] = 5.0
    start = time.monotonic()
    code, report = run(base_url, tmp_path, "--concurrency", "4", "--request-timeout", "0.3", png=True)
    assert time.monotonic() - start < 3
    assert code == 1  # nothing completed
    s = report["levels"][0]["summary"]
    assert s["errors"] == 8 and s["ttft_ms_p50"] is None
    assert all(r["error"].startswith("timeout") for r in report["levels"][0]["requests"])
    assert (tmp_path / "bench.png").read_bytes()[:8] == PNG_MAGIC  # an all-failed level still plots


def test_unreachable_server_fails_cleanly(tmp_path, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    assert serve_bench.main(bench_args(f"http://127.0.0.1:{port}/v1", tmp_path)) == 1
    assert "cannot list models" in capsys.readouterr().err
    assert not (tmp_path / "bench.json").exists()


def test_missing_matplotlib_is_reported_before_running(fake, tmp_path, monkeypatch, capsys):
    base_url, state = fake
    monkeypatch.setitem(__import__("sys").modules, "matplotlib.figure", None)
    assert serve_bench.main(bench_args(base_url, tmp_path, png=True)) == 1
    assert "pip install" in capsys.readouterr().err
    assert state["count"] == 0


def test_percentile_matches_numpy():
    values = list(np.random.default_rng(0).exponential(size=37))
    for q in (0, 50, 90, 99, 100):
        assert serve_bench.percentile(values, q) == pytest.approx(np.percentile(values, q))
    assert serve_bench.percentile([], 50) is None


def test_bad_concurrency_is_rejected():
    with pytest.raises(ValueError):
        serve_bench.ServeBenchConfig(concurrency=(0, 4))
    with pytest.raises(argparse.ArgumentTypeError):
        serve_bench.parse_levels("1,four")


def test_warmup_is_sent_but_not_recorded(fake, tmp_path):
    base_url, state = fake
    code, report = run(base_url, tmp_path, "--concurrency", "4", "--num-warmups", "1")
    assert code == 0 and state["count"] == 9
    assert len(report["levels"][0]["requests"]) == 8
