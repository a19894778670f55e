"""What the engine hands back: one RequestOutput per request, one CompletionOutput per sequence."""

from dataclasses import dataclass

from graphllm.runtime.sampler import Logprob


@dataclass
class CompletionOutput:
    index: int  # 0..n-1 within the request
    text: str  # text so far (while streaming, minus a held-back tail that might start a stop string)
    token_ids: list[int]
    logprobs: list[dict[int, Logprob]] | None  # per output token: sampled + top-N alternatives
    finish_reason: str | None  # None while running; "stop" | "length" | "abort"
    stop_reason: int | str | None = None  # the stop token id or stop string, if one ended it
    delta_text: str = ""  # text new since the previous RequestOutput of this request

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
