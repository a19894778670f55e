"""Post-processing of a step: sample the logits, append the tokens, check stops, report requests.

The step loop hands over logits (or tokens sampled on the device) and the sequences they belong
to; this room turns them into tokens on the sequences, finished sequences out of the scheduler,
logprobs with their text, and RequestOutput snapshots of the requests that advanced.
"""

import torch

from graphllm.runtime.outputs import RequestOutput
from graphllm.runtime.requests import Request
from graphllm.runtime.sampler import Sampler, SamplingRow
from graphllm.runtime.scheduler import Scheduler
from graphllm.runtime.sequence import Sequence
from graphllm.runtime.setup import RuntimeState
from graphllm.runtime.stopping import check_stop
from graphllm.runtime.structured_output import StructuredOutputManager, accept


class PostProcessor:
    def __init__(self, sampler: Sampler, scheduler: Scheduler, state: RuntimeState, tokenizer,
                 requests: dict[str, Request], structured: StructuredOutputManager):
        self.sampler, self.scheduler, self.state, self.tokenizer = sampler, scheduler, state, tokenizer
        self.structured = structured
        self.requests = requests  # the engine's own dict: finished requests leave it when reported
        self._token_texts: dict[int, str] = {}  # token id -> its decoded text, for logprobs

    # -- sampling ---------------------------------------------------------------------------

    def constrain(self, logits: torch.Tensor, seqs: list[Sequence]) -> None:
        """Apply the grammars of structured-output rows to logits, in place (before either sampling path)."""
        self.structured.constrain(logits, seqs)

    def constrain_drafts(self, logits: torch.Tensor, seqs: list[Sequence], proposals: list[list[int]]) -> None:
        """The same for a verify step's 1 + k rows per sequence (speculative decoding): row j is masked by
        the grammar as it stands after proposals[:j]."""
        self.structured.constrain_drafts(logits, seqs, proposals)

    def sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> None:
        """Sample one token per row of logits on the host and append it to its sequence."""
        out = self.sampler(logits, self.sampling_rows(seqs))
        for seq, token, logprobs in zip(seqs, out.token_ids, out.logprobs):
            self.append_token(seq, token, logprobs)

    def append_token(self, seq: Sequence, token: int, logprobs: dict | None) -> None:
        """Give seq a sampled token (and its logprobs entry, if asked for), then check its stops."""
        seq.append_token(token)
        if logprobs is not None:
            seq.logprobs.append(self._decode_logprobs(logprobs))
        self.update_stop(seq, token)

    def sample_on_device(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor | None:
        """The rows' tokens [R] left on the device; None when a row needs sample() instead."""
        return self.sampler.sample_on_device(logits, self.sampling_rows(seqs))

    def sampling_rows(self, seqs: list[Sequence]) -> list[SamplingRow]:
        # The rows hold the sequences' own token lists (no copies): the sampler only reads them.
        return [SamplingRow(s.params, s.prompt_token_ids, s.output_token_ids, s.generator,
                            self.min_tokens_stop_ids(s)) for s in seqs]

    def min_tokens_stop_ids(self, seq: Sequence) -> tuple[int, ...]:
        params = seq.params
        if seq.num_output_tokens >= params.min_tokens:
            return ()  # min_tokens reached: the sampler forbids nothing
        eos = () if params.ignore_eos else tuple(self.state.eos_token_ids)
        return eos + tuple(params.stop_token_ids or ())

    # -- stops ------------------------------------------------------------------------------

    def update_stop(self, seq: Sequence, token: int) -> None:
        """Detokenize seq's new token and finish seq if it stops there (EOS, stop id or string, length)."""
        verdict = accept(seq, token)  # the grammar's: it terminated, or refused the token
        stop = check_stop(seq, token, self.state.eos_token_ids, self.state.max_model_len)
        if stop is None and verdict is not None:
            stop = (verdict, None)
        if seq.detokenizer is not None and (stop is None or stop[0] == "length"):
            # EOS and stop tokens never become text; stop strings, like stop ids, end it only past min_tokens
            past_min = seq.num_output_tokens > seq.params.min_tokens
            stop_str = seq.detokenizer.update([token], check_stop=past_min)
            if stop_str is not None:
                stop = ("stop", stop_str)
        if stop is not None:
            self.scheduler.finish(seq, stop[0])
            seq.stop_reason = stop[1]

    # -- logprob text -----------------------------------------------------------------------

    def _decode_logprobs(self, logprobs: dict) -> dict:
        if self.tokenizer is not None:
            for token, lp in logprobs.items():
                lp.decoded_token = self._token_text(token)
        return logprobs

    def _token_text(self, token: int) -> str:
        text = self._token_texts.get(token)
        if text is None:
            text = self._token_texts[token] = self.tokenizer.decode([token])
        return text

    # -- outputs ----------------------------------------------------------------------------

    def report(self, request_ids: set[str]) -> list[RequestOutput]:
        """Snapshots of the requests that advanced; those of generate() only once finished."""
        touched = (self.requests.get(rid) for rid in request_ids)
        return [self._output(r) for r in touched if r is not None and (r.report_progress or r.finished)]

    def _output(self, request: Request) -> RequestOutput:
        out = request.snapshot()
        if out.finished:
            self.requests.pop(request.request_id, None)
        return out
