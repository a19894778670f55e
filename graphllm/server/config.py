"""ServerConfig: what `graphllm serve` adds to the EngineConfig, built once at the entry point."""

from dataclasses import dataclass

DEFAULT_MAX_BODY_BYTES = 16 * 2**20


@dataclass(frozen=True)
class ServerConfig:
    served_model_names: tuple[str, ...]  # the first is the name responses carry
    api_key: str | None = None  # None: no authentication
    tool_call_parser: str | None = None  # a TOOL_PARSERS key; None: requests with tools get a 400
    reasoning_parser: str | None = None  # a REASONING_PARSERS key; None: no reasoning_content
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES  # larger request bodies get a 413
    max_logprobs: int = 20  # largest logprobs / top_logprobs a request may ask for

    def __post_init__(self):
        if not self.served_model_names or not all(self.served_model_names):
            raise ValueError("served_model_names must hold at least one non-empty name")
        if self.max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be >= 1, got {self.max_body_bytes}")
        if self.tool_call_parser is not None:
            from graphllm.server.tool_parsers import TOOL_PARSERS
            _check_choice("tool_call_parser", self.tool_call_parser, TOOL_PARSERS)
        if self.reasoning_parser is not None:
            from graphllm.server.reasoning_parsers import REASONING_PARSERS
            _check_choice("reasoning_parser", self.reasoning_parser, REASONING_PARSERS)

    @property
    def model_name(self) -> str:
        return self.served_model_names[0]


def _check_choice(name: str, value: str, choices: dict) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {sorted(choices)}, got {value!r}")
