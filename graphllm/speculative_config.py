"""SpeculativeConfig: how the engine guesses tokens ahead and verifies them (vLLM's speculative_config).

    EngineConfig(speculative_config={"method": "ngram", "num_speculative_tokens": 4,
                                     "prompt_lookup_max": 4, "prompt_lookup_min": 2})
    EngineConfig(speculative_config={"model": "path/to/draft", "num_speculative_tokens": 4})

Built from a dict (the CLI's --speculative-config JSON, or Python); unknown keys and bad values are
errors that name them. No I/O here: the draft model folder is read when the engine starts.
"""

from dataclasses import dataclass, fields
from typing import Any

METHODS = ("ngram", "draft_model", "oracle")  # oracle: graphllm bench spec only (spec_decode/oracle.py)
NOT_YET = ("eagle", "eagle3", "medusa", "mlp_speculator", "mtp", "suffix")  # vLLM's other methods
DEFAULT_PROMPT_LOOKUP = 5  # vLLM's, when neither prompt_lookup_min nor prompt_lookup_max is given


@dataclass(frozen=True)
class SpeculativeConfig:
    """method: "ngram" (prompt lookup) or "draft_model" (inferred when model is given).

    num_speculative_tokens: k, the tokens proposed per sequence and step (verified in one target step).
    prompt_lookup_max / prompt_lookup_min (ngram): the longest and shortest suffix n-gram looked up;
    one given sets the other to it, neither gives 5 and 5 (vLLM's defaults).
    model (draft_model): a Hugging Face folder of a small model sharing the target's vocabulary.
    """

    num_speculative_tokens: int
    method: str | None = None
    model: str | None = None
    prompt_lookup_max: int | None = None
    prompt_lookup_min: int | None = None

    @classmethod
    def from_dict(cls, options: dict[str, Any]) -> "SpeculativeConfig":
        if not isinstance(options, dict):
            raise ValueError(f"speculative_config must be a dict (or SpeculativeConfig), got {type(options).__name__}")
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise ValueError(f"speculative_config: unknown key(s) {', '.join(map(repr, unknown))}; "
                             f"known: {', '.join(known)}")
        if "num_speculative_tokens" not in options:
            raise ValueError("speculative_config: num_speculative_tokens is required")
        return cls(**options)

    def __post_init__(self):
        method = self.method if self.method is not None else "draft_model" if self.model is not None else None
        if method is None:
            raise ValueError("speculative_config: give method ('ngram') or model (a draft model folder)")
        if method in NOT_YET:
            raise ValueError(f"speculative_config: method {method!r} is not supported yet; one of {METHODS}")
        if method not in METHODS:
            raise ValueError(f"speculative_config: method must be one of {METHODS}, got {method!r}")
        object.__setattr__(self, "method", method)
        check_int("num_speculative_tokens", self.num_speculative_tokens, 1)
        if method == "ngram":
            self._resolve_prompt_lookup()
        elif method == "draft_model":
            self._check_draft_model()
        elif self.model is not None or self.prompt_lookup_min is not None or self.prompt_lookup_max is not None:
            raise ValueError("speculative_config: method 'oracle' (a benchmark's proposer) takes no other options")

    def _resolve_prompt_lookup(self) -> None:
        if self.model is not None:
            raise ValueError(f"speculative_config: method 'ngram' takes no model (got {self.model!r})")
        low, high = self.prompt_lookup_min, self.prompt_lookup_max
        for name, value in (("prompt_lookup_min", low), ("prompt_lookup_max", high)):
            if value is not None:
                check_int(name, value, 1)
        if low is None and high is None:
            low = high = DEFAULT_PROMPT_LOOKUP
        low, high = (high if low is None else low), (low if high is None else high)
        if low > high:
            raise ValueError(f"speculative_config: prompt_lookup_min ({low}) must be <= prompt_lookup_max ({high})")
        object.__setattr__(self, "prompt_lookup_min", low)
        object.__setattr__(self, "prompt_lookup_max", high)

    def _check_draft_model(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(f"speculative_config: method 'draft_model' needs model (a folder), got {self.model!r}")
        given = [n for n in ("prompt_lookup_max", "prompt_lookup_min") if getattr(self, n) is not None]
        if given:
            raise ValueError(f"speculative_config: {', '.join(given)} only apply to method 'ngram'")


def check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"speculative_config: {name} must be an integer >= {minimum}, got {value!r}")


def as_speculative_config(value: "SpeculativeConfig | dict | None") -> "SpeculativeConfig | None":
    """EngineConfig's speculative_config field: None, a SpeculativeConfig, or a dict of its fields."""
    if value is None or isinstance(value, SpeculativeConfig):
        return value
    return SpeculativeConfig.from_dict(value)
