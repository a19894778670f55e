"""The asyncio stream driver: one background task steps the engine for every open stream.

Each stream opens a queue under its request id; while any queue is open and requests remain,
the task runs `step` in a thread of its own and hands each output to its request's queue, so the
concurrent streams of one event loop share one continuous batch. An engine failure is put in
every open queue, for each stream to raise. The step's thread is not one of asyncio's default
threads, where the server tokenizes and templates requests: a burst of large requests there held
every running stream's next step back (s37's fuzzing).
"""

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from graphllm.runtime.client import EngineDeadError
from graphllm.runtime.outputs import RequestOutput


class StreamDriver:
    def __init__(self, step: Callable[[], list[RequestOutput]], has_work: Callable[[], bool]):
        self.step, self.has_work = step, has_work
        self.queues: dict[str, asyncio.Queue] = {}
        self._task: asyncio.Task | None = None
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="graphllm-step")  # steps run one after another
        self.failure: EngineDeadError | None = None  # set when a step raised: the driver stopped for good

    def open(self, request_id: str) -> asyncio.Queue:
        """The queue where request_id's outputs (or the engine's exception) will arrive."""
        queue = self.queues[request_id] = asyncio.Queue()
        self._ensure_task()
        return queue

    def close(self, request_id: str) -> None:
        """Stop delivering request_id's outputs (aborting it is the caller's part)."""
        self.queues.pop(request_id, None)

    def _ensure_task(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._drive())

    async def _drive(self) -> None:
        """Step while any stream waits; hand each output to its stream's queue."""
        try:
            while self.queues and self.has_work():
                for out in await asyncio.get_running_loop().run_in_executor(self._thread, self.step):
                    if out.request_id in self.queues:
                        self.queues[out.request_id].put_nowait(out)
                await asyncio.sleep(0)
        except Exception as e:  # the engine is dead: every waiting stream gets the error, new ones too
            self.failure = EngineDeadError(f"the engine failed: {type(e).__name__}: {e}")
            self.failure.__cause__ = e
            for queue in self.queues.values():
                queue.put_nowait(self.failure)
            raise
