"""Real uvicorn servers on 127.0.0.1 (free ports, background threads) and `openai` clients.

`server`: the demo model (or a tiny random model when the demo is absent), eager, hermes tool
parser, API key, a small body limit. `scripted_server`: the same engine's tokenizer and KV pool
behind a scripted `stream` (tests/server/scripted.py), for tool calls and reasoning whatever
the model says.
"""

import json
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx2 as httpx  # the HTTP client the openai package ships with
import openai
import pytest
import uvicorn

from graphllm.config import EngineConfig
from graphllm.runtime.engine import Engine
from graphllm.server.app import build_app
from graphllm.server.config import ServerConfig

API_KEY = "test-key"
MODEL = "demo"
MAX_BODY_BYTES = 256 * 1024
TINY_CHAT_TEMPLATE = ("{% for m in messages %}{{ m.role }} {{ m.content or '' }} {% endfor %}"
                      "{% if tools %}tools {% endif %}assistant")


@dataclass
class Running:
    base_url: str  # http://127.0.0.1:PORT
    engine: object
    config: ServerConfig

    def client(self, **kwargs) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base_url}/v1", api_key=kwargs.pop("api_key", API_KEY),
                             max_retries=0, timeout=60, **kwargs)

    def async_client(self, **kwargs) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{self.base_url}/v1", api_key=API_KEY, max_retries=0, timeout=60,
                                  **kwargs)

    def get(self, path: str, auth: bool = True) -> httpx.Response:
        headers = {"Authorization": f"Bearer {API_KEY}"} if auth else {}
        return httpx.get(self.base_url + path, timeout=30, headers=headers)

    def post(self, path: str, body, headers: dict | None = None, auth: bool = True,
             timeout: float = 60) -> httpx.Response:
        """A raw POST: dicts and lists go as JSON, bytes, text and generators as they are."""
        headers = {"content-type": "application/json", **(headers or {})}
        if auth:
            headers["Authorization"] = f"Bearer {API_KEY}"
        content = json.dumps(body) if isinstance(body, (dict, list)) else body
        return httpx.post(self.base_url + path, content=content, timeout=timeout, headers=headers)

    def metrics(self) -> dict[str, float]:
        """`name{labels}` -> value for every graphllm sample of /metrics."""
        samples = {}
        for line in self.get("/metrics").text.splitlines():
            if line.startswith("graphllm:"):
                key, value = line.rsplit(" ", 1)
                samples[key] = float(value)
        return samples


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(app) -> tuple[str, uvicorn.Server, threading.Thread]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    return f"http://127.0.0.1:{port}", server, thread


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory, tiny_model_dir) -> str | None:
    """None: the demo model. Without it, a tiny random Llama with a minimal chat template."""
    from graphllm.demo import DEMO_MODEL_DIR
    if (Path(DEMO_MODEL_DIR) / "config.json").is_file():
        return None
    path, _ = tiny_model_dir("llama")
    (Path(path) / "chat_template.jinja").write_text(TINY_CHAT_TEMPLATE)
    return str(path)


@pytest.fixture(scope="session")
def engine(model_dir):
    return Engine(EngineConfig(model=model_dir, compile=False))


def start(request, engine, **options) -> Running:
    config = ServerConfig(**{"served_model_names": (MODEL, "alias"), "api_key": API_KEY,
                              "max_body_bytes": MAX_BODY_BYTES, **options})
    base_url, server, thread = serve(build_app(engine, config))

    def stop():
        server.should_exit = True
        thread.join(timeout=10)

    request.addfinalizer(stop)
    return Running(base_url, engine, config)


@pytest.fixture(scope="session")
def server(request, engine) -> Running:
    return start(request, engine, tool_call_parser="hermes")


@pytest.fixture(scope="session")
def scripted_server(request, engine) -> Running:
    from tests.server.scripted import ScriptedEngine
    return start(request, ScriptedEngine(engine), tool_call_parser="hermes", reasoning_parser="qwen3")


@pytest.fixture
def client(server) -> openai.OpenAI:
    return server.client()


@pytest.fixture(scope="session")
def pieces_join(model_dir) -> bool:
    """Whether decoded tokens concatenate to the text: byte-level BPE (the demo) yes; the tiny
    models' word-level tokenizer puts spaces between words when decoding a sequence."""
    return model_dir is None
