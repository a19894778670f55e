"""ASGI middleware: API key (401), request body size (413), HTTP request counts by status.

Plain ASGI rather than Starlette's BaseHTTPMiddleware, which would hide `http.disconnect` from the
streaming responses below it.
"""

import secrets

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from graphllm.server.errors import OpenAIError, error_response
from graphllm.server.metrics import ServerMetrics

ENDPOINTS = frozenset({"/v1/models", "/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize",
                       "/health", "/version", "/metrics"})


class APIKeyMiddleware:
    """`Authorization: Bearer <key>` on /v1 routes (vLLM's rule: /health, /metrics etc. stay open)."""

    def __init__(self, app: ASGIApp, api_key: str):
        self.app, self.expected = app, f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1") and scope["method"] != "OPTIONS":
            given = dict(scope["headers"]).get(b"authorization")
            if given is None:
                error = OpenAIError(401, "You didn't provide an API key: send it in an Authorization header "
                                         "(Authorization: Bearer YOUR_KEY).", code="invalid_api_key")
                return await error_response(error)(scope, receive, send)
            if not secrets.compare_digest(given, self.expected):
                error = OpenAIError(401, "Incorrect API key provided.", code="invalid_api_key")
                return await error_response(error)(scope, receive, send)
        await self.app(scope, receive, send)


class BodyLimitMiddleware:
    """A body larger than `max_bytes` gets a 413: at once from Content-Length, else while read."""

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await error_response(self.too_large())(scope, receive, send)
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_bytes:  # chunked body: FastAPI's handlers turn this into the 413
                raise HTTPException(413, self.too_large().message)
            return message

        await self.app(scope, limited_receive, send)

    def too_large(self) -> OpenAIError:
        return OpenAIError(413, f"request body is larger than the server's limit of {self.max_bytes} bytes",
                           code="request_too_large")


class HTTPMetricsMiddleware:
    """Counts every response by endpoint and status, errors from the middleware above included."""

    def __init__(self, app: ASGIApp, metrics: ServerMetrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = 500  # what the server's error middleware answers when nothing was sent

        async def recording_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, recording_send)
        finally:
            path = scope["path"].rstrip("/") or "/"
            endpoint = path if path in ENDPOINTS else "/v1/models" if path.startswith("/v1/models/") else "other"
            self.metrics.observe_http(endpoint, status)
