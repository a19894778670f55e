"""A request: its prompt, sampling parameters and its n sequences, and how it is reported."""

from dataclasses import dataclass, field

from graphllm.runtime.outputs import CompletionOutput, RequestOutput
from graphllm.runtime.sampling_params import SamplingParams
from graphllm.runtime.sequence import Sequence


@dataclass(eq=False)
class Request:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    seqs: list[Sequence] = field(default_factory=list)
    sent_text: dict[int, str] = field(default_factory=dict)  # text handed out so far, per index

    @property
    def finished(self) -> bool:
        return all(seq.is_finished for seq in self.seqs)

    def snapshot(self) -> RequestOutput:
        """The request's state now; each output's delta_text is what is new since the last call."""
        outputs = [self._completion(seq) for seq in self.seqs]
        return RequestOutput(self.request_id, self.prompt, self.prompt_token_ids, outputs, self.finished)

    def _completion(self, seq: Sequence) -> CompletionOutput:
        delta = seq.detokenizer.next_delta(seq.is_finished) if seq.detokenizer else ""
        text = self.sent_text.get(seq.index, "") + delta
        self.sent_text[seq.index] = text
        logprobs = list(seq.logprobs) if seq.logprobs is not None else None
        return CompletionOutput(seq.index, text, list(seq.output_token_ids), logprobs,
                                seq.finish_reason, seq.stop_reason, delta)
