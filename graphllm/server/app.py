"""The FastAPI app: OpenAI routes over one shared Engine, plus tokenize, health, version, metrics.

    app = build_app(engine, ServerConfig(served_model_names=("demo",)))
    uvicorn.run(app, host="127.0.0.1", port=8000)

Every request of every client goes through the same `engine.stream`, so concurrent requests
share one continuous batch. The app sees the engine only through EngineClient.

Its ASGI middleware, outermost first: HTTP request counts by status, CORS (ServerConfig.allowed_origins;
preflights answered here), draining (503 once shutdown began), request body size (413), API key (401: every
route but /health, and /metrics when public).
Plain ASGI rather than Starlette's BaseHTTPMiddleware, which would hide `http.disconnect` from the
streaming responses below it.
"""

import asyncio
import secrets
import time
from dataclasses import dataclass

from fastapi import APIRouter, FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from graphllm.runtime.client import EngineClient, EngineDeadError
from graphllm.server.serving_chat import render_prompt, tool_dict
from graphllm.server.config import ServerConfig
from graphllm.server.errors import OpenAIError, bad_request, error_response, install_error_handlers
from graphllm.server.metrics import CONTENT_TYPE, ServerMetrics
from graphllm.server.protocol import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest
from graphllm.server.serving_chat import ServingChat
from graphllm.server.serving_completions import ServingCompletions
from graphllm.server.serving_engine import Admissions, grammar_executor
from graphllm.version import __version__

router = APIRouter()


@dataclass
class AppState:
    engine: EngineClient
    config: ServerConfig
    metrics: ServerMetrics
    chat: ServingChat
    completions: ServingCompletions
    created: int
    draining: bool = False  # SIGTERM / SIGINT seen (cli/serve.py): new requests get a 503


def state(request: Request) -> AppState:
    return request.app.state.graphllm


def build_app(engine: EngineClient, config: ServerConfig) -> FastAPI:
    app = FastAPI(title="graphllm", version=__version__, docs_url=None, redoc_url=None)
    # both routes share one count of admitted requests and the threads that compile grammars
    metrics, shared = ServerMetrics(engine), (Admissions(), grammar_executor())
    app.state.graphllm = AppState(engine, config, metrics, ServingChat(engine, config, metrics, *shared),
                                  ServingCompletions(engine, config, metrics, *shared), int(time.time()))
    app.include_router(router)
    install_error_handlers(app)
    if config.api_key is not None:
        open_paths = ("/health", "/metrics") if config.metrics_public else ("/health",)
        app.add_middleware(APIKeyMiddleware, api_key=config.api_key, open_paths=open_paths)
    app.add_middleware(BodyLimitMiddleware, max_bytes=config.max_body_bytes)
    app.add_middleware(DrainMiddleware, state=app.state.graphllm)
    if config.allowed_origins:  # outside the API key: a browser's preflight carries no Authorization header
        app.add_middleware(CORSMiddleware, allow_origins=list(config.allowed_origins),
                           allow_methods=list(config.allowed_methods), allow_headers=list(config.allowed_headers),
                           allow_credentials=config.allow_credentials)
    app.add_middleware(HTTPMetricsMiddleware, metrics=metrics)  # outermost: sees 401 and 413 too
    return app


# -- OpenAI ------------------------------------------------------------------------------------

@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, raw: Request):
    return await state(raw).chat.create(body, raw)


@router.post("/v1/completions")
async def completions(body: CompletionRequest, raw: Request):
    return await state(raw).completions.create(body, raw)


@router.get("/v1/models")
async def list_models(raw: Request):
    s = state(raw)
    return {"object": "list", "data": [model_card(s, name) for name in s.config.served_model_names]}


@router.get("/v1/models/{name:path}")
async def retrieve_model(name: str, raw: Request):
    s = state(raw)
    if name not in s.config.served_model_names:
        raise OpenAIError(404, f"The model `{name}` does not exist.", "model", "model_not_found")
    return model_card(s, name)


def model_card(s: AppState, name: str) -> dict:
    return {"id": name, "object": "model", "created": s.created, "owned_by": "graphllm",
            "root": s.config.model_root or name, "max_model_len": s.engine.limits.max_model_len}


# -- vLLM's extras -----------------------------------------------------------------------------

@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, raw: Request):
    s = state(raw)
    s.chat.check_model(body.model)
    if (body.prompt is None) == (body.messages is None):
        raise bad_request("give exactly one of prompt and messages")
    if s.engine.tokenizer is None:
        raise bad_request("this model has no tokenizer")
    tokenizer = s.engine.tokenizer
    if body.messages is not None:  # checked for length first, then templated and tokenized off the event loop
        tools = [tool_dict(t) for t in body.tools or []]
        template_kwargs = s.chat.template_kwargs(body)
        s.chat.check_template_input(body.messages, tools, template_kwargs)
        ids = await asyncio.to_thread(render_prompt, tokenizer, body.messages, tools, template_kwargs)
    else:
        s.chat.check_text_length(len(body.prompt.encode()), "prompt")
        ids = list(await asyncio.to_thread(tokenizer.encode, body.prompt, add_special_tokens=body.add_special_tokens))
    return {"count": len(ids), "max_model_len": s.engine.limits.max_model_len, "tokens": ids}


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, raw: Request):
    s = state(raw)
    s.chat.check_model(body.model)
    if s.engine.tokenizer is None:
        raise bad_request("this model has no tokenizer")
    vocab = s.engine.limits.vocab_size
    if not all(0 <= t < vocab for t in body.tokens):
        raise bad_request(f"tokens must lie in [0, {vocab})", "tokens")
    return {"prompt": await asyncio.to_thread(s.engine.tokenizer.decode, body.tokens)}


@router.post("/reset_prefix_cache")
async def reset_prefix_cache(raw: Request):
    """vLLM's: forget every cached prefix (blocks in use keep their contents); 200 with the count."""
    forgotten = await asyncio.to_thread(state(raw).engine.reset_prefix_cache)
    return JSONResponse({"reset": True, "num_blocks_forgotten": forgotten})


@router.get("/health")
async def health(raw: Request):
    """200 while the engine can serve; 503 once its step loop failed (the server then exits non-zero)."""
    try:
        state(raw).engine.check_health()
    except EngineDeadError as e:
        raise OpenAIError(503, str(e), code="engine_dead") from e
    return Response(status_code=200)


@router.get("/version")
async def version():
    return JSONResponse({"version": __version__})


@router.get("/metrics")
async def metrics(raw: Request):
    return Response(state(raw).metrics.render(), media_type=CONTENT_TYPE)


# -- middleware -------------------------------------------------------------------------------

ENDPOINTS = frozenset({"/v1/models", "/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize",
                       "/reset_prefix_cache", "/health", "/version", "/metrics"})


class APIKeyMiddleware:
    """`Authorization: Bearer <key>` on every route but `open_paths`; the scheme is matched
    case-insensitively (RFC 7235) and the key compared in constant time."""

    def __init__(self, app: ASGIApp, api_key: str, open_paths: tuple[str, ...] = ("/health",)):
        self.app, self.expected, self.open_paths = app, api_key.encode(), open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] != "OPTIONS" and scope["path"] not in self.open_paths:
            error = self.refusal(dict(scope["headers"]).get(b"authorization"))
            if error is not None:
                return await error_response(error)(scope, receive, send)
        await self.app(scope, receive, send)

    def refusal(self, given: bytes | None) -> OpenAIError | None:
        if given is None:
            return OpenAIError(401, "You didn't provide an API key: send it in an Authorization header "
                                    "(Authorization: Bearer YOUR_KEY).", code="invalid_api_key")
        scheme, _, token = given.strip().partition(b" ")
        if scheme.lower() != b"bearer" or not secrets.compare_digest(token.strip(), self.expected):
            return OpenAIError(401, "Incorrect API key provided.", code="invalid_api_key")
        return None


class DrainMiddleware:
    """Once shutdown began (AppState.draining), new requests get a 503 while running streams finish."""

    def __init__(self, app: ASGIApp, state: AppState):
        self.app, self.state = app, state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.state.draining and scope["path"] != "/metrics":
            error = OpenAIError(503, "the server is shutting down", code="shutting_down", headers={"Retry-After": "5"})
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
