"""A request: its prompt, sampling parameters and its n sequences, and how it is reported."""

from dataclasses import dataclass, field

from graphllm.runtime.outputs import CompletionOutput, ListSnapshot, RequestOutput
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
    report_progress: bool = True  # False: Engine.step reports it only once finished

    @property
    def finished(self) -> bool:
        for seq in self.seqs:  # a plain loop: this runs for every request every step
            if not seq.is_finished:
                return False
        return True

    def snapshot(self) -> RequestOutput:
        """The request's state now; each output's delta_text is what is new since the last call.

        O(1) per sequence while the request runs (token lists are ListSnapshots); the last
        snapshot, once every sequence finished, copies them into plain lists.
        """
        finished = self.finished
        outputs = [self._completion(seq, finished) for seq in self.seqs]
        cached = self.seqs[0].num_cached_tokens if self.seqs else None
        return RequestOutput(self.request_id, self.prompt, self.prompt_token_ids, outputs, finished, cached or 0)

    def _completion(self, seq: Sequence, final: bool) -> CompletionOutput:
        delta = seq.detokenizer.next_delta(seq.is_finished) if seq.detokenizer else ""
        text = self.sent_text.get(seq.index, "") + delta
        self.sent_text[seq.index] = text
        view = list if final else ListSnapshot
        logprobs = view(seq.logprobs) if seq.logprobs is not None else None
        tokens = list(seq.output_token_ids) if final else ListSnapshot(seq.output_token_ids,
                                                                      seq.num_resolved_output_tokens)
        return CompletionOutput(seq.index, text, tokens, logprobs,
                                seq.finish_reason, seq.stop_reason, delta)
