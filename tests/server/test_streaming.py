"""graphllm/server/streaming.py with plain async generators: SSE framing, `merge`'s interleaving,
closing and errors, the disconnect helpers, and EventStreamResponse as a bare ASGI app."""

import asyncio
import json

import anyio
import pytest
from pydantic import BaseModel
from starlette.requests import Request

from graphllm.server.errors import OpenAIError
from graphllm.server.streaming import (CLIENT_CLOSED, SSE_DONE, EventStreamResponse, merge, sse, sse_error,
                                       until_disconnect, wait_for_disconnect)

TIMEOUT = 5  # seconds: a bug that hangs fails instead
END = object()
SCOPE = {"type": "http", "method": "POST", "path": "/", "headers": [], "query_string": b""}


class Source:
    """An async iterator fed item by item by the test (an exception is raised where it comes);
    `closed` says whether its finally ran."""

    def __init__(self):
        self.queue: asyncio.Queue = asyncio.Queue()
        self.closed = False

    def put(self, *items) -> None:
        for item in items:
            self.queue.put_nowait(item)

    async def items(self):
        try:
            while (item := await self.queue.get()) is not END:
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            self.closed = True


async def within(awaitable):
    """await with a deadline kept in the calling task (anyio.fail_after). Not asyncio.wait_for: in
    Python 3.11 it awaits in a task of its own, turning the loop a few more times, in which a source
    left open would still be finalized by the garbage collector's hook and hide the missing close."""
    with anyio.fail_after(TIMEOUT):
        return await awaitable


def next_of(it):
    return within(anext(it))


# -- SSE framing ----------------------------------------------------------------------------


class Chunk(BaseModel):
    text: str
    extra: int | None = None


def test_sse_frames_one_data_line_per_event():
    assert sse({"text": "a\nb", "n": 1}) == 'data: {"text": "a\\nb", "n": 1}\n\n'  # the newline escaped
    assert sse(Chunk(text="x\n\ny", extra=3)) == 'data: {"text":"x\\n\\ny","extra":3}\n\n'
    assert sse(Chunk(text="x", extra=3), exclude={"extra"}) == 'data: {"text":"x"}\n\n'
    assert SSE_DONE == "data: [DONE]\n\n"


def test_sse_error_is_openais_error_body():
    frame = sse_error(OpenAIError(400, "max_tokens is too large", "max_tokens", "too_long"))
    assert frame.startswith("data: ") and frame.endswith("\n\n") and frame.count("\n") == 2
    assert json.loads(frame.removeprefix("data: ")) == {"error": {
        "message": "max_tokens is too large", "type": "invalid_request_error", "param": "max_tokens",
        "code": "too_long"}}


# -- merge ----------------------------------------------------------------------------------


def test_merge_yields_items_as_they_come_tagged_with_their_stream():
    async def main():
        a, b, c = Source(), Source(), Source()
        merged = merge([a.items(), b.items(), c.items()])
        b.put("b0")
        assert await next_of(merged) == (1, "b0")  # not waiting for stream 0
        a.put("a0")
        assert await next_of(merged) == (0, "a0")
        c.put("c0", END)  # one stream ending does not end the others
        assert await next_of(merged) == (2, "c0")
        b.put("b1", "b2")
        assert [await next_of(merged), await next_of(merged)] == [(1, "b1"), (1, "b2")]
        a.put(END)
        b.put("b3", END)
        assert await next_of(merged) == (1, "b3")
        with pytest.raises(StopAsyncIteration):
            await next_of(merged)
        assert a.closed and b.closed and c.closed

    asyncio.run(main())


@pytest.mark.parametrize("num_streams", [1, 3])
def test_closing_the_merged_iterator_closes_every_source(num_streams):
    async def main():
        sources = [Source() for _ in range(num_streams)]
        merged = merge([s.items() for s in sources])
        sources[0].put("first")
        assert await next_of(merged) == (0, "first")
        await within(merged.aclose())
        assert all(s.closed for s in sources)

    asyncio.run(main())


@pytest.mark.parametrize("num_streams", [1, 3])
def test_an_error_in_one_source_propagates_and_closes_the_others(num_streams):
    async def main():
        sources = [Source() for _ in range(num_streams)]
        merged = merge([s.items() for s in sources])
        sources[0].put("ok")
        assert await next_of(merged) == (0, "ok")
        sources[-1].put(ValueError("boom"))
        with pytest.raises(ValueError, match="boom"):
            await next_of(merged)
        assert all(s.closed for s in sources)

    asyncio.run(main())


# -- disconnects ----------------------------------------------------------------------------


def receive_from(*messages):
    """An ASGI receive that returns the messages, then blocks forever; and the list of those left."""
    queue = list(messages)

    async def receive():
        if queue:
            return queue.pop(0)
        await asyncio.Event().wait()

    return receive, queue


def test_wait_for_disconnect_returns_on_the_disconnect_message():
    receive, left = receive_from({"type": "http.request", "body": b"", "more_body": False},
                                 {"type": "http.request", "body": b""}, {"type": "http.disconnect"},
                                 {"type": "http.request"})
    asyncio.run(within(wait_for_disconnect(receive)))
    assert left == [{"type": "http.request"}]  # read up to the disconnect, not past it


def test_until_disconnect_returns_the_works_result_while_the_client_stays():
    async def main():
        receive, _ = receive_from()

        async def work():
            await asyncio.sleep(0.01)
            return 42

        async def failing():
            raise KeyError("x")

        assert await within(until_disconnect(Request(SCOPE, receive), work())) == 42
        with pytest.raises(KeyError):
            await within(until_disconnect(Request(SCOPE, receive), failing()))

    asyncio.run(main())


def test_until_disconnect_cancels_the_work_when_the_client_goes():
    async def main():
        receive, _ = receive_from({"type": "http.disconnect"})
        cancelled = []

        async def work():
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.append(True)
                raise

        with pytest.raises(OpenAIError) as raised:
            await within(until_disconnect(Request(SCOPE, receive), work()))
        assert raised.value.status == CLIENT_CLOSED == 499 and cancelled == [True]

    asyncio.run(main())


# -- EventStreamResponse --------------------------------------------------------------------


async def respond(body, receive, send) -> None:
    """Run an EventStreamResponse over body. Callers that check body's closing keep their own
    reference to it, so that only the response, not the garbage collector, can have closed it."""
    response = EventStreamResponse(body)
    await within(response(SCOPE, receive, send))


def test_event_stream_sends_every_event_then_ends():
    async def body():
        yield "data: 1\n\n"
        yield SSE_DONE

    sent = []

    async def send(message):
        sent.append(message)

    receive, _ = receive_from()  # the client never leaves
    asyncio.run(respond(body(), receive, send))
    start = sent[0]
    headers = dict(start["headers"])
    assert start["status"] == 200 and headers[b"content-type"].startswith(b"text/event-stream")
    assert headers[b"cache-control"] == b"no-cache" and headers[b"x-accel-buffering"] == b"no"
    assert [(m["body"], m["more_body"]) for m in sent[1:]] == [
        (b"data: 1\n\n", True), (SSE_DONE.encode(), True), (b"", False)]


@pytest.mark.parametrize("stuck_in", ["generation", "send"])
def test_event_stream_closes_its_generator_when_the_client_leaves(stuck_in):
    """The client leaves while the next event is being generated, or while one is being sent to it
    (the generator then waits at its yield, where only an explicit aclose reaches its finally)."""
    closed, sent = [], []

    async def body():
        try:
            yield "data: 1\n\n"
            await asyncio.Event().wait()  # a generation that would never end
            yield "data: never\n\n"
        finally:
            closed.append(True)

    async def main():
        gone = asyncio.Event()

        async def send(message):
            sent.append(message)
            if message.get("body"):
                gone.set()
                if stuck_in == "send":
                    await asyncio.Event().wait()  # a client that reads nothing more

        async def receive():
            await gone.wait()
            return {"type": "http.disconnect"}

        stream = body()
        await respond(stream, receive, send)
        assert closed == [True]

    asyncio.run(main())
    assert [m.get("body") for m in sent[1:]] == [b"data: 1\n\n"]
