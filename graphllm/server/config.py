"""ServerConfig: what `graphllm serve` adds to the EngineConfig, built once at the entry point."""

import json
from dataclasses import dataclass
from pathlib import Path

DEFAULT_MAX_BODY_BYTES = 16 * 2**20
DEFAULT_MAX_N = 128  # choices of one request (n, best_of)
DEFAULT_MAX_QUEUED_REQUESTS = 1024  # engine requests waiting to be scheduled before new ones get a 503
# the sampling fields a generation_config.json may default (vLLM applies the same)
GENERATION_DEFAULTS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
DEFAULT_MAX_LOGPROBS = 20  # vLLM's --max-logprobs
DEFAULT_SHUTDOWN_TIMEOUT = 30.0  # seconds running streams get to finish after SIGTERM / SIGINT


@dataclass(frozen=True)
class ServerConfig:
    served_model_names: tuple[str, ...]  # the first is the name responses carry
    api_key: str | None = None  # None: no authentication
    tool_call_parser: str | None = None  # a TOOL_PARSERS key; None: requests with tools get a 400
    reasoning_parser: str | None = None  # a REASONING_PARSERS key; None: no reasoning_content
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES  # larger request bodies get a 413
    max_logprobs: int = DEFAULT_MAX_LOGPROBS  # largest logprobs / top_logprobs a request may ask for
    max_n: int = DEFAULT_MAX_N  # largest n (and best_of) a request may ask for
    max_queued_requests: int = DEFAULT_MAX_QUEUED_REQUESTS  # waiting engine requests; beyond: 503 + Retry-After
    max_prompts: int = 256  # prompts of one /v1/completions batch
    max_stop: int = 64  # entries of stop and of stop_token_ids
    max_tools: int = 128  # tools of one chat request
    metrics_public: bool = False  # /metrics open without the API key
    trust_request_chat_template: bool = False  # a request's own chat_template is used (else: a 400)
    model_root: str | None = None  # what /v1/models shows as `root` (the --model / --artifact given)
    # CORS (vLLM's --allowed-origins / --allowed-methods / --allowed-headers / --allow-credentials, and its
    # defaults): browsers on these origins may call the API; preflights are answered before the API key check
    allowed_origins: tuple[str, ...] = ("*",)
    allowed_methods: tuple[str, ...] = ("*",)
    allowed_headers: tuple[str, ...] = ("*",)
    allow_credentials: bool = False
    # the sampling defaults of requests that leave them out (vLLM's --generation-config): "auto", the model's own
    # generation_config.json; "vllm", none (temperature 1.0, ...); else a folder holding a generation_config.json.
    # override_generation_config's keys (GENERATION_DEFAULTS) take precedence over either
    generation_config: str = "auto"
    override_generation_config: dict | None = None

    def __post_init__(self):
        if not self.served_model_names or not all(self.served_model_names):
            raise ValueError("served_model_names must hold at least one non-empty name")
        if self.generation_config not in ("auto", "vllm"):
            _check_generation_config(Path(self.generation_config).expanduser() / "generation_config.json")
        unknown = sorted(set(self.override_generation_config or {}) - set(GENERATION_DEFAULTS))
        if unknown:
            raise ValueError(f"override_generation_config sets {', '.join(GENERATION_DEFAULTS)}, not "
                             f"{', '.join(unknown)}")
        for name in ("max_body_bytes", "max_n", "max_queued_requests", "max_prompts", "max_stop", "max_tools",
                     "max_logprobs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.tool_call_parser is not None:
            from graphllm.server.tool_parsers import TOOL_PARSERS
            _check_choice("tool_call_parser", self.tool_call_parser, TOOL_PARSERS)
        if self.reasoning_parser is not None:
            from graphllm.server.reasoning_parsers import REASONING_PARSERS
            _check_choice("reasoning_parser", self.reasoning_parser, REASONING_PARSERS)

    @property
    def model_name(self) -> str:
        return self.served_model_names[0]


def _check_generation_config(path: Path) -> None:
    """--generation-config DIR: its generation_config.json must be there and hold a JSON object (the server reads
    its sampling defaults once it has started)."""
    if not path.is_file():
        raise ValueError(f"generation_config is 'auto', 'vllm' or a folder holding a generation_config.json: "
                         f"{path.parent} holds none")
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"generation_config: {path} is not a JSON file ({e})") from None
    if not isinstance(value, dict):
        raise ValueError(f"generation_config: {path} holds {type(value).__name__}, not a JSON object")


def _check_choice(name: str, value: str, choices: dict) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {sorted(choices)}, got {value!r}")
