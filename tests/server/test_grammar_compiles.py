"""Slow grammar compiles hold no other request (s36's fuzzing): a JSON schema can take xgrammar minutes to
compile (a 40,000-value enum took 18 s on the demo model's 398-word vocabulary), and compiles ran in
asyncio's default threads, which tokenizing and the engine's steps use too. Seven such requests on a 2-core
machine (6 default threads) stopped every other request until they finished."""

import os
import threading

from tests.server.conftest import MODEL, start


class SlowCompiles:
    """The real engine, except that its grammar compiles wait until `release` is set, like compiles that take
    minutes; `entered` counts the compiles under way."""

    def __init__(self, engine):
        self.engine, self.release, self.entered = engine, threading.Event(), 0

    def __getattr__(self, name: str):
        return getattr(self.engine, name)

    def check_structured_outputs(self, params) -> None:
        self.entered += 1
        self.release.wait(timeout=60)
        self.engine.check_structured_outputs(params)


def test_slow_grammar_compiles_hold_no_other_request(request, engine):
    slow = SlowCompiles(engine)
    running = start(request, slow)
    client = running.client()
    statuses = []

    def constrained(i: int) -> None:
        out = client.completions.create(model=MODEL, prompt="Hi", max_tokens=4,
                                        extra_body={"structured_outputs": {"regex": f"x{i}[a-c]+"}})
        statuses.append(out.choices[0].text.startswith(f"x{i}"))

    threads = [threading.Thread(target=constrained, args=(i,)) for i in range(min(32, os.cpu_count() + 4) + 1)]
    try:
        for thread in threads:
            thread.start()
        while slow.entered < 2:  # the compiles have begun
            threading.Event().wait(0.05)
        plain = client.with_options(timeout=15).completions.create(model=MODEL, prompt="Hi", max_tokens=2)
        assert plain.choices[0].finish_reason in ("length", "stop")
    finally:
        slow.release.set()
        for thread in threads:
            thread.join(timeout=60)
    assert statuses == [True] * len(threads)
