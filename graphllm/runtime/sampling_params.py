"""Per-request sampling parameters (OpenAI / vLLM compatible subset)."""

from __future__ import annotations

import array
import math
import numbers
from dataclasses import dataclass

from graphllm.runtime.structured_output import StructuredOutputsParams

# Temperatures below this are treated as 0 (greedy): dividing by them overflows.
_GREEDY_EPS = 1e-5
LOGIT_BIAS_LIMIT = 100.0  # OpenAI's range of a logit_bias value; vLLM clamps to it

FLOAT_FIELDS = ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty",
                "frequency_penalty")
INT_FIELDS = ("n", "top_k", "seed", "max_tokens", "min_tokens", "logprobs")  # None allowed where the default is


@dataclass
class SamplingParams:
    """How one request turns logits into tokens and when it stops.

    Validation happens in ``__post_init__``; any bad value raises ``ValueError``
    naming the parameter. ``stop`` and ``stop_token_ids`` are normalized to lists.
    """

    n: int = 1
    temperature: float = 1.0  # 0 => greedy
    top_p: float = 1.0  # (0, 1]
    top_k: int = 0  # 0 or -1 => off; >= 1 otherwise
    min_p: float = 0.0  # [0, 1]
    repetition_penalty: float = 1.0  # > 0; HF semantics over prompt + output tokens
    presence_penalty: float = 0.0  # [-2, 2]; OpenAI semantics over output tokens
    frequency_penalty: float = 0.0  # [-2, 2]; OpenAI semantics over output tokens
    seed: int | None = None
    max_tokens: int | None = 16  # None => engine decides (up to max_model_len)
    min_tokens: int = 0  # >= 0 and <= max_tokens
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    logprobs: int | None = None  # top alternatives besides the sampled token
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    # a grammar the output must match (runtime/structured_output.py); a dict of its fields is accepted
    structured_outputs: StructuredOutputsParams | None = None
    # OpenAI's logit_bias: token id -> a number added to that token's logit before the penalties (as vLLM;
    # clamped to [-100, 100] as vLLM does); logprobs stay the raw model's
    logit_bias: dict[int, float] | None = None

    def __post_init__(self) -> None:
        self.stop = _normalize_stop(self.stop)
        for name in INT_FIELDS:  # 1.5 tokens, "4", True: a type error here, not deep in the sampler (s35's fuzzing)
            value = getattr(self, name)
            if value is not None or name not in ("seed", "max_tokens", "logprobs"):
                _check(_integer(value), name, value, "must be an integer")
                setattr(self, name, int(value))  # numpy's integers too
        _check(isinstance(self.stop_token_ids, (list, tuple, type(None)))
               and all(_integer(t) and t >= 0 for t in self.stop_token_ids or ()), "stop_token_ids",
               self.stop_token_ids, "must be a list of non-negative integers")
        self.stop_token_ids = [int(t) for t in self.stop_token_ids or ()]
        if isinstance(self.structured_outputs, dict):
            self.structured_outputs = StructuredOutputsParams(**self.structured_outputs)
        for name in FLOAT_FIELDS:  # NaN and +-inf pass every comparison below or poison the sampler
            value = getattr(self, name)
            _check(isinstance(value, numbers.Real) and not isinstance(value, bool), name, value, "must be a number")
            _check(math.isfinite(value), name, value, "must be a finite number")
            # the sampler computes in float32: 1e39 would be inf there, and a top_p of 1e-46 would be 0
            _check(math.isfinite(float32(value)), name, value, "must fit in float32 (at most 3.4e38)")
        self._verify_sampling()
        self._verify_penalties()
        self._verify_lengths()
        self._verify_logit_bias()

    def _verify_logit_bias(self) -> None:
        if self.logit_bias is None:
            return
        _check(isinstance(self.logit_bias, dict), "logit_bias", self.logit_bias,
               "must map token ids to numbers")
        for token, bias in self.logit_bias.items():
            _check(_integer(token) and token >= 0, "logit_bias", token, "keys must be token ids (integers >= 0)")
            _check(isinstance(bias, numbers.Real) and not isinstance(bias, bool) and math.isfinite(bias),
                   "logit_bias", bias, f"values must be finite numbers (token {token})")
        self.logit_bias = {int(t): min(max(float(b), -LOGIT_BIAS_LIMIT), LOGIT_BIAS_LIMIT)
                           for t, b in self.logit_bias.items()} or None

    @property
    def greedy(self) -> bool:
        """True when the request takes the argmax (temperature ~ 0)."""
        return self.temperature < _GREEDY_EPS

    @property
    def top_k_enabled(self) -> bool:
        """True when top-k restricts the support (top_k >= 1)."""
        return self.top_k >= 1

    def _verify_sampling(self) -> None:
        _check(self.n >= 1, "n", self.n, "must be >= 1")
        _check(self.temperature >= 0.0, "temperature", self.temperature, "must be >= 0")
        _check(0.0 < float32(self.top_p) <= 1.0, "top_p", self.top_p, "must be in (0, 1] (in float32)")
        _check(self.top_k >= -1, "top_k", self.top_k, "must be -1, 0 (off) or >= 1")
        _check(0.0 <= self.min_p <= 1.0, "min_p", self.min_p, "must be in [0, 1]")
        if self.logprobs is not None:
            _check(self.logprobs >= 0, "logprobs", self.logprobs, "must be >= 0")

    def _verify_penalties(self) -> None:
        _check(
            float32(self.repetition_penalty) > 0.0,
            "repetition_penalty", self.repetition_penalty, "must be > 0 (in float32)",
        )
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check(-2.0 <= value <= 2.0, name, value, "must be in [-2, 2]")

    def _verify_lengths(self) -> None:
        if self.max_tokens is not None:
            _check(self.max_tokens >= 1, "max_tokens", self.max_tokens, "must be >= 1")
        _check(self.min_tokens >= 0, "min_tokens", self.min_tokens, "must be >= 0")
        if self.max_tokens is not None:
            _check(
                self.min_tokens <= self.max_tokens, "min_tokens", self.min_tokens,
                f"must be <= max_tokens ({self.max_tokens})",
            )
        for s in self.stop:
            _check(
                isinstance(s, str) and len(s) > 0, "stop", self.stop,
                "must contain only non-empty strings",
            )


def _normalize_stop(stop: list[str] | str | None) -> list[str]:
    """None -> [], "x" -> ["x"], list -> a copy of the list."""
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    return list(stop)


def float32(value: float) -> float:
    """value rounded to float32, as the sampler sees it (inf past its range, 0 below its smallest)."""
    return array.array("f", [float(value)])[0]


def _integer(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check(ok: bool, name: str, value: object, rule: str) -> None:
    if not ok:
        raise ValueError(f"{name} {rule}, got {value!r}")
