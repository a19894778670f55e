"""Faults (issue 17): a full queue answers 503 + Retry-After; a draining server refuses new work;
an engine whose step fails fails its requests in OpenAI's error shape, turns /health to 503 and
stops the server with exit code 1, instead of hanging behind a healthy /health."""

import threading
import time

import httpx2 as httpx
import openai
import pytest

from graphllm.cli.serve import serve_app
from graphllm.config import EngineConfig
from graphllm.runtime.engine import Engine
from graphllm.runtime.sampling_params import SamplingParams
from graphllm.server.app import build_app
from graphllm.server.config import ServerConfig
from graphllm.server.errors import OpenAIError
from tests.server.conftest import API_KEY, MODEL, free_port, serve
from tests.server.test_errors import check_shape

COMPLETION = {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 2}
AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture
def fresh_engine(model_dir) -> Engine:
    """An engine of its own (these tests break or fill it), one sequence at a time."""
    return Engine(EngineConfig(model=model_dir, compile=False, max_num_seqs=1))


def post(base: str, body: dict, **kwargs) -> httpx.Response:
    return httpx.post(base + "/v1/completions", json=body, headers=AUTH, timeout=30, **kwargs)


def test_full_queue_is_503_with_retry_after(fresh_engine):
    app = build_app(fresh_engine, ServerConfig(served_model_names=(MODEL,), api_key=API_KEY, max_queued_requests=2))
    base, server, thread = serve(app)
    try:
        waiting = [fresh_engine.add_request([1, 2, 3], SamplingParams(max_tokens=4)) for _ in range(2)]
        assert fresh_engine.stats().num_requests_waiting == 2  # no step ran: both wait
        response = post(base, COMPLETION)
        check_shape(response, 503, code="server_overloaded")
        assert response.headers["retry-after"] == "1"
        for request_id in waiting:
            fresh_engine.abort(request_id)
        assert post(base, COMPLETION).status_code == 200  # room again
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_admitted_requests_hold_their_place_until_the_engine_takes_them(fresh_engine):
    """Regression (s35's fuzzing): 40 requests at once against --max-queued-requests 4 left 24 waiting, because the
    check read the engine's queue while the requests admitted before were still templating or tokenizing off the
    event loop. An admitted request now counts until the engine has it (or it is gone)."""
    app = build_app(fresh_engine, ServerConfig(served_model_names=(MODEL,), max_queued_requests=4))
    chat, completions = app.state.graphllm.chat, app.state.graphllm.completions
    held = chat.check_capacity(3)
    with pytest.raises(OpenAIError) as full:
        completions.check_capacity(2)  # the other route shares the count
    assert full.value.status == 503
    held.release()  # the engine took one (OpenAIServing.generate)
    also = completions.check_capacity(2)
    del held, also  # handlers and streams gone: what they held is free
    assert chat.admissions.pending == 0
    with pytest.raises(OpenAIError) as never:
        completions.check_capacity(5)  # more than the queue holds at all: the request's fault
    assert never.value.status == 400


def test_concurrent_requests_never_queue_past_the_limit(fresh_engine):
    app = build_app(fresh_engine, ServerConfig(served_model_names=(MODEL,), api_key=API_KEY, max_queued_requests=4))
    base, server, thread = serve(app)
    peak, statuses, done = [0], [], threading.Event()

    def watch():
        while not done.is_set():
            peak[0] = max(peak[0], fresh_engine.stats().num_requests_waiting)
            time.sleep(0.001)

    def client():
        statuses.append(post(base, {**COMPLETION, "max_tokens": 8, "ignore_eos": True}).status_code)

    watcher = threading.Thread(target=watch)
    clients = [threading.Thread(target=client) for _ in range(24)]
    try:
        watcher.start()
        for c in clients:
            c.start()
        for c in clients:
            c.join(timeout=60)
        done.set()
        watcher.join()
        assert sorted(set(statuses)) <= [200, 503] and statuses.count(200) >= 1 and len(statuses) == 24
        assert peak[0] <= 4, f"{peak[0]} requests waited past --max-queued-requests 4"
        assert app.state.graphllm.chat.admissions.pending == 0
    finally:
        done.set()
        server.should_exit = True
        thread.join(timeout=10)


def test_a_draining_server_refuses_new_requests(fresh_engine):
    app = build_app(fresh_engine, ServerConfig(served_model_names=(MODEL,), api_key=API_KEY))
    base, server, thread = serve(app)
    try:
        assert post(base, COMPLETION).status_code == 200
        app.state.graphllm.draining = True  # what SIGTERM / SIGINT set (cli/serve.py)
        response = post(base, COMPLETION)
        check_shape(response, 503, code="shutting_down")
        assert "retry-after" in response.headers
        assert httpx.get(base + "/health", timeout=10).status_code == 503
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def break_after(engine: Engine, good_steps: int) -> None:
    """Inject a fault: the step loop raises from its (good_steps + 1)-th step on."""
    step, calls = engine.step_loop._step, [0]

    def failing():
        calls[0] += 1
        if calls[0] > good_steps:
            raise RuntimeError("injected step failure")
        return step()

    engine.step_loop._step = failing


def test_a_failing_step_fails_requests_turns_health_503_and_exits_1(fresh_engine):
    break_after(fresh_engine, good_steps=2)
    app = build_app(fresh_engine, ServerConfig(served_model_names=(MODEL,), api_key=API_KEY))
    port, result = free_port(), {}
    thread = threading.Thread(target=lambda: result.update(code=serve_app(
        app, fresh_engine, "127.0.0.1", port, shutdown_timeout=2, log_level="warning")))
    thread.start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while not _up(base):
        assert time.monotonic() < deadline, "server did not come up"
        time.sleep(0.05)
    client = openai.OpenAI(base_url=base + "/v1", api_key=API_KEY, max_retries=0, timeout=30)
    with pytest.raises(openai.APIError, match="the engine failed: RuntimeError: injected step failure"):
        for _ in client.completions.create(model=MODEL, prompt=[1, 2, 3], max_tokens=50, stream=True):
            pass  # two steps stream, then the error event arrives in OpenAI's shape
    try:  # the engine is dead: new requests fail, /health is no longer 200 (503, or the server is gone)
        check_shape(post(base, COMPLETION), 500, code="engine_dead")
        assert httpx.get(base + "/health", timeout=5).status_code == 503
    except httpx.TransportError:
        pass
    thread.join(timeout=30)
    assert not thread.is_alive() and result["code"] == 1  # the process would exit 1


def _up(base: str) -> bool:
    try:
        return httpx.get(base + "/health", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def test_kv_exhaustion_preempts_and_queues_never_fails(model_dir):
    """Four long prompts at once into a KV pool that holds one of them: each is preempted or queued
    in turn, every request completes, and the pool ends empty."""
    import concurrent.futures

    engine = Engine(EngineConfig(model=model_dir, compile=False, max_num_seqs=4, max_model_len=128, num_kv_blocks=8))
    base, server, thread = serve(build_app(engine, ServerConfig(served_model_names=(MODEL,), api_key=API_KEY)))
    try:
        prompts = [[(7 * i + j) % 50 + 3 for j in range(100)] for i in range(4)]
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            responses = list(pool.map(lambda p: post(base, {**COMPLETION, "prompt": p, "max_tokens": 24,
                                                             "ignore_eos": True}), prompts))
        assert [r.status_code for r in responses] == [200] * 4
        assert all(r.json()["usage"]["completion_tokens"] == 24 for r in responses)
        assert engine.stats()[:4] == (0, 0, 8, 8)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
