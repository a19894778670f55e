"""`graphllm serve`: the OpenAI-compatible HTTP server on one engine.

    graphllm serve                                   # the built-in demo model on 127.0.0.1:8000
    graphllm serve --model DIR --api-key KEY --tool-call-parser hermes
    python -m graphllm.cli serve [serve flags]       # the same, from a checkout
"""

import argparse
import asyncio
import gc
import json
import os
import sys
import time

from graphllm.cli.args import add_engine_args, engine_config, json_object
from graphllm.cli.environment import Environment
from graphllm.server.config import (DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_LOGPROBS, DEFAULT_MAX_N,
                                    DEFAULT_MAX_QUEUED_REQUESTS, DEFAULT_SHUTDOWN_TIMEOUT, GENERATION_DEFAULTS,
                                    ServerConfig)

DEMO_MODEL_NAME = "graphllm-demo"
# uvicorn closes idle connections after 5 s, exactly when httpx (the openai client) drops them: a request
# sent on a connection at that moment was reset (measured on CPU, 60 clients each resending after 4.98-5.02 s
# idle: 7 of 300 requests failed with a 5 s server keep-alive, 0 of 300 with 30 s). Idle connections now
# outlive the clients' own expiry.
DEFAULT_KEEP_ALIVE = 30.0
TRANSPORT_CLOSE_GRACE = 1.0  # s a closed connection's transport gets to finish (a TLS close_notify) at shutdown
DEMO_TOOL_CALL_PARSER = "hermes"  # the format the demo model's chat template teaches


def port_number(text: str) -> int:
    """--port: checked when the flags are read, not after the model has loaded."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is in [1, 65535], got {port}")
    return port


def add_serve_parser(subparsers, env: Environment = Environment()) -> argparse.ArgumentParser:
    """Register `serve` (engine flags shared with `generate`, plus the server's own)."""
    parser = subparsers.add_parser("serve", help="OpenAI-compatible HTTP server (FastAPI + uvicorn)",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_engine_args(parser)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=port_number, default=8000)
    parser.add_argument("--api-key", default=env.api_key,
                        help="require `Authorization: Bearer KEY` on /v1 routes (default: $GRAPHLLM_API_KEY)")
    parser.add_argument("--served-model-name", nargs="+",
                        help="names clients use in `model` (default: the --model/--artifact path, or "
                             f"{DEMO_MODEL_NAME}); the first is the one responses carry")
    parser.add_argument("--tool-call-parser", metavar="{hermes,llama3_json}",
                        help=f"parse tool calls out of the output (default: none; {DEMO_TOOL_CALL_PARSER} "
                             "for the demo model)")
    parser.add_argument("--enable-auto-tool-choice", action="store_true",
                        help="accepted for vLLM compatibility: --tool-call-parser alone enables tool calls")
    parser.add_argument("--reasoning-parser", metavar="{deepseek_r1,qwen3}",
                        help="split <think> reasoning into reasoning_content")
    parser.add_argument("--max-request-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                        help="larger request bodies get a 413, before they are parsed")
    parser.add_argument("--max-n", type=int, default=DEFAULT_MAX_N, help="largest n (and best_of) of a request")
    parser.add_argument("--max-queued-requests", type=int, default=DEFAULT_MAX_QUEUED_REQUESTS,
                        help="requests waiting to be scheduled; beyond this new ones get 503 + Retry-After")
    parser.add_argument("--shutdown-timeout", type=float, default=DEFAULT_SHUTDOWN_TIMEOUT,
                        help="seconds running streams get to finish after SIGTERM / SIGINT (new requests: 503)")
    parser.add_argument("--metrics-public", action="store_true", help="serve /metrics without the API key")
    parser.add_argument("--trust-request-chat-template", action="store_true",
                        help="use a chat template a request sends (chat_template, chat_template_kwargs) instead "
                             "of refusing it with a 400; a template is a program the server runs")
    parser.add_argument("--timeout-keep-alive", type=float, default=DEFAULT_KEEP_ALIVE,
                        help="seconds an idle connection stays open; above the clients' own (httpx: 5 s), so a "
                             "client never reuses a connection the server is closing at that moment")
    parser.add_argument("--allowed-origins", type=json_list, default=["*"],
                        help='CORS: origins browsers may call the API from, a JSON list (default ["*"], as vLLM\'s; '
                             "[] sends no CORS headers)")
    parser.add_argument("--allowed-methods", type=json_list, default=["*"], help="CORS: allowed methods (JSON list)")
    parser.add_argument("--allowed-headers", type=json_list, default=["*"], help="CORS: allowed headers (JSON list)")
    parser.add_argument("--allow-credentials", action="store_true", help="CORS: allow credentials")
    parser.add_argument("--ssl-keyfile", help="serve HTTPS with this private key (PEM) and --ssl-certfile")
    parser.add_argument("--ssl-certfile", help="serve HTTPS with this certificate chain (PEM)")
    parser.add_argument("--generation-config", default="auto", metavar="{auto,vllm,DIR}",
                        help="sampling defaults of requests that leave them out: auto, the model's "
                             "generation_config.json; vllm, none; or a folder holding one")
    parser.add_argument("--override-generation-config", type=json_object, metavar="JSON",
                        help=f"sampling defaults over --generation-config's, e.g. '{{\"temperature\": 0.5}}' "
                             f"({', '.join(GENERATION_DEFAULTS)})")
    parser.add_argument("--max-logprobs", type=int, default=DEFAULT_MAX_LOGPROBS,
                        help="the largest logprobs / top_logprobs a request may ask for")
    parser.add_argument("--trust-remote-code", action="store_true",
                        help="accepted for vLLM compatibility: graphllm runs its own model code, never a checkpoint's")
    parser.add_argument("--disable-log-requests", action="store_true",
                        help="accepted for vLLM compatibility: requests are not logged")
    parser.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    parser.set_defaults(func=cmd_serve)
    return parser


def server_config(args: argparse.Namespace) -> ServerConfig:
    serves_demo = args.model is None and args.artifact is None
    names = args.served_model_name or [DEMO_MODEL_NAME if serves_demo else args.model or args.artifact]
    tool_call_parser = args.tool_call_parser or (DEMO_TOOL_CALL_PARSER if serves_demo else None)
    return ServerConfig(served_model_names=tuple(names), api_key=args.api_key, tool_call_parser=tool_call_parser,
                        reasoning_parser=args.reasoning_parser, max_body_bytes=args.max_request_bytes,
                        max_n=args.max_n, max_queued_requests=args.max_queued_requests,
                        metrics_public=args.metrics_public,
                        trust_request_chat_template=args.trust_request_chat_template,
                        model_root=args.model or args.artifact or (DEMO_MODEL_NAME if serves_demo else None),
                        allowed_origins=tuple(args.allowed_origins), allowed_methods=tuple(args.allowed_methods),
                        allowed_headers=tuple(args.allowed_headers), allow_credentials=args.allow_credentials,
                        generation_config=args.generation_config,
                        override_generation_config=args.override_generation_config, max_logprobs=args.max_logprobs)


def json_list(text: str) -> list[str]:
    """--allowed-origins and its peers: a JSON list of strings, as vLLM takes them."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise argparse.ArgumentTypeError(f'expected a JSON list of strings, e.g. \'["https://app.example"]\', '
                                         f"got {text!r}")
    return value


def ssl_files(args: argparse.Namespace) -> dict:
    """uvicorn's TLS options: --ssl-keyfile and --ssl-certfile together, each a readable file, checked before the
    model loads."""
    given = {"ssl_keyfile": args.ssl_keyfile, "ssl_certfile": args.ssl_certfile}
    if not any(given.values()):
        return {}
    if not all(given.values()):
        raise ValueError("HTTPS needs both --ssl-keyfile and --ssl-certfile")
    for name, path in given.items():
        if not os.path.isfile(path):
            raise ValueError(f"--{name.replace('_', '-')} {path}: no such file")
    return given


def cmd_serve(args: argparse.Namespace) -> int:
    from graphllm.runtime.engine import Engine
    from graphllm.server.app import build_app
    config, tls = server_config(args), ssl_files(args)  # before loading the model: flag mistakes fail fast
    engine = Engine(engine_config(args))
    app = build_app(engine, config)
    freeze_startup_heap()
    print(f"graphllm: serving {config.model_name} at http{'s' if tls else ''}://{args.host}:{args.port}/v1",
          flush=True)
    return serve_app(app, engine, args.host, args.port, args.shutdown_timeout, args.log_level,
                     args.timeout_keep_alive, tls)


def freeze_startup_heap() -> None:
    """Move every object alive after start-up (the model, the tokenizer, the compiled step, the libraries) out of
    the garbage collector's reach, as vLLM's server does: a full collection walked all of them each time, on the
    event loop while a large body was parsed and in the step thread. On the CPU with the demo engine loaded (370k
    tracked objects), a 14.6 MiB body of 100k chat messages parsed in 0.38-0.40 s instead of 0.63-0.85 s, one of
    450k one-word messages in 1.85-1.91 s instead of 2.48-2.68 s (`PYTHONPATH=. python benchmarks/body_parse.py`,
    2026-12-07)."""
    gc.collect()
    gc.freeze()


def serve_app(app, engine, host: str, port: int, shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT,
              log_level: str = "info", timeout_keep_alive: float = DEFAULT_KEEP_ALIVE, tls: dict | None = None) -> int:
    """Run uvicorn until SIGTERM / SIGINT (exit code 0) or until the engine fails (1); `tls`: ssl_files'."""
    import uvicorn
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=shutdown_timeout,
                            timeout_keep_alive=timeout_keep_alive, **(tls or {}))
    server = _server_class()(config, app.state.graphllm, engine)
    server.run()
    try:
        engine.check_health()
    except Exception as e:  # the step loop died: say so, and exit non-zero
        print(f"graphllm: error: {e}", file=sys.stderr, flush=True)
        return 1
    return 0


def _server_class():
    """uvicorn.Server that drains on a signal and stops when the engine fails (uvicorn imported lazily)."""
    import uvicorn

    class GraphllmServer(uvicorn.Server):
        def __init__(self, config, state, engine):
            super().__init__(config)
            self.state, self.engine = state, engine

        def handle_exit(self, sig, frame) -> None:
            self.state.draining = True  # new requests: 503; running streams get shutdown_timeout
            super().handle_exit(sig, frame)
            # uvicorn re-raises the signals it caught once it has shut down (the process would die of
            # SIGTERM); a drained shutdown is a clean exit, code 0
            getattr(self, "_captured_signals", []).clear()

        async def shutdown(self, sockets=None) -> None:
            watcher = asyncio.ensure_future(self._abort_closed_transports())
            try:
                await super().shutdown(sockets)
            finally:
                watcher.cancel()

        async def _abort_closed_transports(self) -> None:
            """A connection uvicorn has closed counts until its transport is gone, and over TLS asyncio waits up to
            30 s (its ssl_shutdown_timeout) for the client's close_notify, which an idle keep-alive client never
            sends: SIGTERM took 31 s with one idle openai client connected. Such transports are aborted after
            TRANSPORT_CLOSE_GRACE; connections still streaming are not closing, and keep their drain time."""
            closing_since: dict[int, float] = {}
            while True:
                await asyncio.sleep(0.1)
                now = time.monotonic()
                for connection in list(self.server_state.connections):
                    transport = getattr(connection, "transport", None)
                    if transport is not None and transport.is_closing():
                        if now - closing_since.setdefault(id(connection), now) > TRANSPORT_CLOSE_GRACE:
                            transport.abort()

        async def on_tick(self, counter: int) -> bool:
            if counter % 5 == 0 and not self.should_exit:  # every 0.5 s
                try:
                    self.engine.check_health()
                except Exception:
                    self.state.draining, self.should_exit = True, True
            return await super().on_tick(counter)

    return GraphllmServer
