"""Request intake: a prompt and its SamplingParams become a Request with n fresh Sequences.

Text prompts are tokenized, token-id prompts checked against the vocabulary, and every prompt
against max_model_len, before anything reaches the scheduler. Request and sequence ids come from
one counter.
"""

import itertools

import torch

from graphllm.runtime.client import Prompt
from graphllm.runtime.requests import Request
from graphllm.runtime.sampling_params import SamplingParams
from graphllm.runtime.sequence import Sequence
from graphllm.runtime.setup import RuntimeState


class RequestIntake:
    def __init__(self, tokenizer, state: RuntimeState):
        self.tokenizer, self.state = tokenizer, state
        self._ids = itertools.count()

    def prompt_ids(self, prompt: Prompt) -> tuple[str | None, list[int]]:
        """(the prompt's text if given as text, its token ids), checked to leave room for output."""
        prompt_text, ids = self._tokenize(prompt)
        if len(ids) >= self.state.max_model_len:
            raise ValueError(f"prompt has {len(ids)} tokens; max_model_len is "
                             f"{self.state.max_model_len} (prompt + at least one output token)")
        return prompt_text, ids

    def new_request_id(self) -> str:
        return f"req-{next(self._ids)}"

    def new_request(self, request_id: str, prompt_text: str | None, prompt_ids: list[int],
                    params: SamplingParams) -> Request:
        request = Request(request_id, prompt_text, prompt_ids, params)
        request.seqs = [self._new_sequence(request, i) for i in range(params.n)]
        return request

    def _tokenize(self, prompt: Prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this model folder has no tokenizer: pass prompts as token id lists")
            return prompt, self.tokenizer.encode(prompt)
        if not prompt or not all(isinstance(t, int) for t in prompt):
            raise ValueError("a prompt must be a non-empty string or a non-empty list of token ids")
        vocab = self.state.model_config.vocab_size
        if not all(0 <= t < vocab for t in prompt):
            raise ValueError(f"prompt token ids must lie in [0, {vocab})")
        return None, list(prompt)

    def _new_sequence(self, request: Request, index: int) -> Sequence:
        params, generator = request.params, None
        if params.seed is not None:
            generator = torch.Generator(self.state.device)
            generator.manual_seed((params.seed * 0x9E3779B1 + index) % 2**63)
        seq = Sequence(next(self._ids), request.request_id, index, list(request.prompt_token_ids),
                       len(request.prompt_token_ids), params, generator)
        seq.detokenizer = self._detokenizer(request)
        seq.logprobs = [] if params.logprobs is not None else None
        return seq

    def _detokenizer(self, request: Request):
        from graphllm.runtime.detokenizer import IncrementalDetokenizer
        if self.tokenizer is None:
            return None
        p = request.params
        return IncrementalDetokenizer(self.tokenizer, request.prompt_token_ids,
                                      skip_special_tokens=p.skip_special_tokens, stop=p.stop or (),
                                      include_stop_str_in_output=p.include_stop_str_in_output)
