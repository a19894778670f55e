"""The stream driver steps the engine in a thread of its own, not one of asyncio's default threads."""

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from graphllm import Engine, SamplingParams


def test_streams_advance_while_asyncios_default_threads_are_busy():
    """Regression (s37's server fuzzing): the driver ran each step with asyncio.to_thread, in the default threads
    where the server also tokenizes and templates requests; while those were all busy (a burst of large requests)
    no running stream got its next token."""
    engine = Engine.from_pretrained()

    async def main() -> float:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(1))
        release = threading.Event()
        busy = asyncio.to_thread(release.wait, 30)  # the one default thread, held
        busy_task = asyncio.ensure_future(busy)
        await asyncio.sleep(0.05)
        start = time.perf_counter()
        async for out in engine.stream([1, 5, 9], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)):
            last = out
        took = time.perf_counter() - start
        release.set()
        await busy_task
        assert last.finished and len(last.outputs[0].token_ids) == 4
        return took

    assert asyncio.run(main()) < 20
