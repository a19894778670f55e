"""EngineClient, the server's one interface to the engine: Engine implements every member, its
limits are the runtime state's, and stats() follows a request from waiting to running to idle."""

import asyncio
import inspect
from contextlib import aclosing

import pytest

from graphllm import Engine, SamplingParams
from graphllm.runtime.client import EngineClient, EngineLimits, EngineStats

PROMPT = [1, 5, 9, 17]


@pytest.fixture(scope="module")
def engine():
    return Engine.from_pretrained()  # no model given: the demo model


def idle(engine) -> EngineStats:
    pool = engine.pool
    return EngineStats(0, 0, pool.num_blocks, pool.num_blocks, pool.prefix_cache_queries, pool.prefix_cache_hits)


def client_members() -> list[str]:
    return [name for name in vars(EngineClient) if not name.startswith("_")]


def test_engine_implements_every_member(engine):
    assert sorted(client_members()) == ["abort", "check_health", "check_structured_outputs", "limits", "model_path",
                                       "reset_prefix_cache", "stats", "stream", "tokenizer"]
    assert isinstance(engine, EngineClient)
    for name in client_members():
        assert hasattr(engine, name), name
        if inspect.isfunction(vars(EngineClient)[name]):
            assert callable(getattr(engine, name)), name
    assert inspect.isasyncgenfunction(Engine.stream)
    assert engine.tokenizer is not None and engine.model_path == engine.state.model_path
    assert (engine.model_path / "generation_config.json").is_file()


def test_limits_match_the_state(engine):
    state = engine.state
    assert engine.limits == EngineLimits(max_model_len=state.max_model_len,
                                         vocab_size=state.model_config.vocab_size,
                                         max_num_seqs=state.limits.max_num_seqs)


def test_stats_follow_a_request_until_it_finishes(engine):
    assert engine.stats() == idle(engine)
    request_id = engine.add_request(PROMPT, SamplingParams(n=2, temperature=0, max_tokens=4, ignore_eos=True))
    waiting = engine.stats()
    assert (waiting.num_requests_running, waiting.num_requests_waiting) == (0, 1)  # one request, two sequences
    assert waiting.num_free_blocks == waiting.num_blocks
    engine.step()
    running = engine.stats()
    assert (running.num_requests_running, running.num_requests_waiting) == (1, 0)
    assert running.num_free_blocks < running.num_blocks == engine.pool.num_blocks
    finished = False
    while engine.has_unfinished_requests():
        finished |= any(o.finished and o.request_id == request_id for o in engine.step())
    assert finished and engine.stats() == idle(engine)


def test_stats_go_back_to_idle_after_abort(engine):
    request_id = engine.add_request(PROMPT, SamplingParams(max_tokens=50, ignore_eos=True))
    engine.step()
    assert engine.stats().num_requests_running == 1
    engine.abort(request_id)
    assert engine.stats() == idle(engine)


def test_stats_go_back_to_idle_when_a_stream_is_left_early(engine):
    async def first_output():
        async with aclosing(engine.stream(PROMPT, SamplingParams(max_tokens=50, ignore_eos=True))) as stream:
            async for out in stream:
                return out, engine.stats()

    out, during = asyncio.run(first_output())
    assert not out.finished and during.num_requests_running == 1
    assert engine.stats() == idle(engine)
