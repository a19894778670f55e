"""Server-sent events, client disconnects, and merging the streams of a multi-prompt request.

A client that goes away must stop its generation at once: every engine stream here is closed
explicitly (never left to the garbage collector), and closing `EngineClient.stream` aborts the
request and frees its KV blocks.
"""

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable
from contextlib import aclosing
from typing import Any, TypeVar

import anyio
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from graphllm.server.errors import CLIENT_CLOSED, OpenAIError, error_body

T = TypeVar("T")
SSE_DONE = "data: [DONE]\n\n"


def sse(payload: BaseModel | dict, exclude: set[str] | None = None) -> str:
    data = payload.model_dump_json(exclude=exclude) if isinstance(payload, BaseModel) else json.dumps(payload)
    return f"data: {data}\n\n"


def sse_error(error: OpenAIError) -> str:
    """An error after the 200 went out: the openai client raises APIError on such an event."""
    return sse(error_body(error.status, error.message, error.param, error.code))


async def wait_for_disconnect(receive: Receive) -> None:
    """Return when the client has gone (call only once the request body has been read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class EventStreamResponse(StreamingResponse):
    """An SSE response whose body generator is cancelled and closed as soon as the client leaves.

    Starlette only notices a gone client when a send fails, i.e. after the next token; this
    listens for the disconnect while generating and closes the generator in any case.
    """

    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[str]):
        super().__init__(content, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as group:
                async def stream() -> None:
                    try:
                        await self.stream_response(send)
                    except OSError:  # the client went away during a send
                        pass
                    group.cancel_scope.cancel()

                group.start_soon(stream)
                await wait_for_disconnect(receive)
                group.cancel_scope.cancel()
        finally:
            await self.body_iterator.aclose()


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await `work`, cancelling it if the client disconnects first (then raise a 499)."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(wait_for_disconnect(request.receive))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (task, watch):
            t.cancel()
        await asyncio.gather(task, watch, return_exceptions=True)
    if not task.cancelled():
        return task.result()
    raise OpenAIError(CLIENT_CLOSED, "client closed the connection")


_END = object()


async def merge(streams: list[AsyncIterator[T]]) -> AsyncIterator[tuple[int, T]]:
    """Interleave several async iterators as their items come: (stream index, item).

    Leaving the loop early closes every stream; the first error raised by one stream ends it.
    """
    if len(streams) == 1:
        async with aclosing(streams[0]) as only:
            async for item in only:
                yield 0, item
        return
    queue: asyncio.Queue[tuple[int, Any, BaseException | None]] = asyncio.Queue()

    async def pump(i: int, stream: AsyncIterator[T]) -> None:
        try:
            async with aclosing(stream):
                async for item in stream:
                    queue.put_nowait((i, item, None))
        except Exception as e:
            queue.put_nowait((i, None, e))
        else:
            queue.put_nowait((i, _END, None))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            i, item, error = await queue.get()
            if error is not None:
                raise error
            if item is _END:
                remaining -= 1
            else:
                yield i, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
