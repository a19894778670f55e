"""Engine: the Python API. Requests in, RequestOutputs out, one continuous batch underneath.

    engine = Engine.from_pretrained("path/to/hf-folder")      # or no path: the demo model
    outs = engine.generate(["Hello"], SamplingParams(max_tokens=32))
    async for out in engine.stream("Hello", params): ...

`generate` drives the loop itself; `stream` shares one background driver task among all
concurrent streams of an event loop (continuous batching across callers). The Engine takes
requests in (a prompt and its SamplingParams become a Request with n Sequences: text is
tokenized, token ids checked against the vocabulary, every prompt against max_model_len, before
anything reaches the scheduler) and wires its rooms together: the step loop (step_loop.py),
post-processing (postprocess.py) and the stream driver (stream_driver.py). The server sees it
through EngineClient (client.py).
"""

import itertools
from collections.abc import AsyncIterator, Sequence as Seq
from pathlib import Path

import torch
from tqdm.auto import tqdm

from graphllm.config import EngineConfig
from graphllm.runtime.client import EngineLimits, EngineStats, Prompt
from graphllm.runtime.outputs import RequestOutput
from graphllm.runtime.postprocess import PostProcessor
from graphllm.runtime.requests import Request
from graphllm.runtime.sampler import Sampler
from graphllm.runtime.sampling_params import SamplingParams
from graphllm.runtime.sequence import Sequence
from graphllm.runtime.setup import build_runtime
from graphllm.runtime.spec_decode.decoder import build_speculative_decoder
from graphllm.runtime.step_loop import StepLoop
from graphllm.runtime.stream_driver import StreamDriver
from graphllm.runtime.structured_output import StructuredOutputManager


class Engine:
    """The public API over the runtime pieces; implements EngineClient for the server."""

    def __init__(self, config: EngineConfig):
        self.config = config
        rt = build_runtime(config)
        self.model, self.tokenizer, self.state = rt.model, rt.tokenizer, rt.state
        self.pool, self.scheduler, self.runner = rt.pool, rt.scheduler, rt.runner
        self.requests: dict[str, Request] = {}
        self.limits = EngineLimits(self.state.max_model_len, self.state.model_config.vocab_size,
                                   self.state.limits.max_num_seqs)
        self._ids = itertools.count()  # request and sequence ids
        self.structured_outputs = StructuredOutputManager(self.tokenizer, self.state.model_config.vocab_size,
                                                          list(self.state.eos_token_ids))
        self._post = PostProcessor(Sampler(), self.scheduler, self.state, self.tokenizer, self.requests,
                                   self.structured_outputs)
        self.spec_decoder = build_speculative_decoder(config, rt, self._post)  # None without speculative_config
        # public, unlike the other rooms: benchmarks time its parts
        self.step_loop = StepLoop(config, self.scheduler, self.pool, self.runner, self.state, self._post,
                                  self.spec_decoder)
        self._streams = StreamDriver(self.step_loop.step, self.scheduler.has_unfinished)
        self._shut_down = False

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def shutdown(self) -> None:
        """Abort every request and stop the processes the engine started (its tensor-parallel workers); later
        requests are refused. Dropping the engine, or the end of a `with Engine...(...) as engine:` block, does
        the same; calling it again does nothing."""
        for request_id in list(self.requests):
            self.abort(request_id)
        self._shut_down = True
        stop = getattr(self.runner.step, "stop", None)  # TensorParallelStep's; a local step holds no process
        if stop is not None:
            stop()

    @classmethod
    def from_pretrained(cls, path: str | None = None, **options) -> "Engine":
        """Load a Hugging Face folder (None: the built-in demo model); options: EngineConfig fields.

        compile=True compiles it first (or reuses the compiled artifact cached for it).
        """
        return cls(EngineConfig(model=None if path is None else str(path), **options))

    @classmethod
    def load(cls, artifact: str, **options) -> "Engine":
        """Load a `graphllm compile` artifact: no tracing, no code generation."""
        return cls(EngineConfig(artifact=str(artifact), **options))

    @property
    def sampler(self) -> Sampler:
        """The sampler of every step; assigning one swaps it (benchmarks time it, tests force tokens)."""
        return self._post.sampler

    @sampler.setter
    def sampler(self, sampler: Sampler) -> None:
        self._post.sampler = sampler

    @property
    def async_scheduling(self) -> bool:
        """Whether each step launches the next before reading back its tokens (see StepLoop)."""
        return self.step_loop.async_scheduling

    # -- requests ---------------------------------------------------------------------------

    def add_request(self, prompt: Prompt, params: SamplingParams | None = None,
                    request_id: str | None = None) -> str:
        """Queue a prompt (text or token ids) with its n sequences; returns the request id."""
        if self._shut_down:
            raise RuntimeError("the engine was shut down (Engine.shutdown): load a new one")
        params = params if params is not None else SamplingParams()
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
        vocab = self.state.model_config.vocab_size
        if any(t >= vocab for t in params.stop_token_ids):
            raise ValueError(f"stop_token_ids must lie in [0, {vocab}), got {params.stop_token_ids}")
        if outside := [t for t in params.logit_bias or () if t >= vocab]:
            raise ValueError(f"logit_bias keys must lie in [0, {vocab}), got {outside[:8]}")
        prompt_text, prompt_ids = self._prompt_ids(prompt)
        request_id = request_id or f"req-{next(self._ids)}"
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        request = Request(request_id, prompt_text, prompt_ids, params)
        # a grammar compiles once per request (ValueError when it does not); each sequence matches on its own
        grammar = None if params.structured_outputs is None else self.structured_outputs.compiled_for(
            params.structured_outputs)
        request.seqs = [self._new_sequence(request, i) for i in range(params.n)]
        for seq in request.seqs if grammar is not None else []:
            seq.grammar = self.structured_outputs.matcher(grammar)
        with self.step_loop.lock:  # step() may run in a worker thread meanwhile
            self.requests[request_id] = request
            for seq in request.seqs:
                self.scheduler.add(seq)
        return request_id

    def abort(self, request_id: str) -> None:
        """Stop a request now and free its KV blocks; unknown or finished ids are ignored."""
        with self.step_loop.lock:  # step() may run in a worker thread meanwhile
            request = self.requests.pop(request_id, None)
            for seq in request.seqs if request else []:
                if not seq.is_finished:
                    self.scheduler.finish(seq, "abort")

    def has_unfinished_requests(self) -> bool:
        """Whether any sequence still waits or runs."""
        return self.scheduler.has_unfinished()

    def _prompt_ids(self, prompt: Prompt) -> tuple[str | None, list[int]]:
        """(the prompt's text if given as text, its token ids), checked to leave room for output."""
        prompt_text, ids = self._tokenize(prompt)
        if len(ids) >= self.state.max_model_len:
            raise ValueError(f"prompt has {len(ids)} tokens; max_model_len is "
                             f"{self.state.max_model_len} (prompt + at least one output token)")
        return prompt_text, ids

    def _tokenize(self, prompt: Prompt) -> tuple[str | None, list[int]]:
        vocab = self.state.model_config.vocab_size
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this model folder has no tokenizer: pass prompts as token id lists")
            text, ids = prompt, self.tokenizer.encode(prompt)
            if not ids:  # "" (without a BOS) or text the tokenizer drops: a step of no tokens cannot run
                raise ValueError(f"the prompt {prompt[:40]!r} tokenizes to no tokens")
        # bool is an int, and bytes iterate as ints: neither is a token id list
        elif not isinstance(prompt, (list, tuple)) or not prompt or not all(type(t) is int for t in prompt):
            raise ValueError("a prompt must be a non-empty string or a non-empty list of token ids (int), got "
                             f"{type(prompt).__name__}")
        else:
            text, ids = None, list(prompt)
        if not all(0 <= t < vocab for t in ids):  # the embedding would index past its rows
            raise ValueError(f"prompt token ids must lie in [0, {vocab})" if text is None else
                             f"the prompt {text[:40]!r} tokenizes to ids outside the model's vocabulary [0, {vocab}) "
                             f"(largest {max(ids)}): the tokenizer does not match the model")
        return text, ids

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

    # -- the loop ---------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Schedule, run the model once, sample, and report every request that advanced.

        Requests of generate() are reported only once finished: nothing reads their progress.
        Under async scheduling the tokens a call reports are those of the step before: each
        call launches one step and reads back the previous one.
        """
        return self.step_loop.step()  # under the step loop's lock

    # -- entry points -----------------------------------------------------------------------

    def generate(self, prompts: Prompt | Seq[Prompt],
                 params: SamplingParams | Seq[SamplingParams] | None = None,
                 use_tqdm: bool = False) -> list[RequestOutput]:
        """Run prompts to completion; outputs come back in prompt order."""
        if isinstance(prompts, str) or (isinstance(prompts, (list, tuple)) and prompts
                                        and isinstance(prompts[0], int)):
            prompts = [prompts]
        if not isinstance(prompts, (list, tuple)):
            raise ValueError("prompts must be a string, a token id list or a list of them, got "
                             f"{type(prompts).__name__}")
        params_list = params if isinstance(params, (list, tuple)) else [params] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError(f"got {len(params_list)} SamplingParams for {len(prompts)} prompts")
        ids: list[str] = []
        try:  # a prompt refused, or a step that fails, leaves none of this call's requests behind
            for p, sp in zip(prompts, params_list):
                ids.append(self.add_request(p, sp))
                self.requests[ids[-1]].report_progress = False  # only the final outputs are kept
            finished: dict[str, RequestOutput] = {}
            with tqdm(total=len(ids), disable=not use_tqdm, desc="generate") as bar:
                while len(finished) < len(ids):
                    for out in self.step():
                        if out.finished:
                            finished[out.request_id] = out
                            bar.update(1)
        except BaseException:
            for request_id in ids:
                self.abort(request_id)
            raise
        return [finished[i] for i in ids]

    def chat(self, messages: list[dict] | list[list[dict]], params: SamplingParams | None = None,
             **template_kwargs) -> list[RequestOutput]:
        """generate() over conversations rendered with the model's chat template."""
        convs = messages if messages and isinstance(messages[0], list) else [messages]
        return self.generate([self.apply_chat_template(c, **template_kwargs) for c in convs], params)

    def apply_chat_template(self, messages: list[dict], **kwargs) -> list[int]:
        if self.tokenizer is None or not getattr(self.tokenizer, "chat_template", None):
            raise ValueError("this model has no chat template")
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                 return_dict=False, **kwargs)
        return list(ids)

    async def stream(self, prompt: Prompt, params: SamplingParams | None = None,
                     request_id: str | None = None) -> AsyncIterator[RequestOutput]:
        """Yield a RequestOutput each step the request advances; the last one has finished=True.

        Leaving the loop early (break, cancellation, client disconnect) aborts the request.
        """
        self.check_health()  # a dead engine takes no new request
        request_id = self.add_request(prompt, params, request_id)
        queue = self._streams.open(request_id)
        try:
            while True:
                out = await queue.get()
                if isinstance(out, BaseException):
                    raise out
                yield out
                if out.finished:
                    return
        finally:
            self._streams.close(request_id)
            self.abort(request_id)

    # -- EngineClient (the server's view) ---------------------------------------------------

    @property
    def model_path(self) -> Path:
        """The model folder or compiled artifact this engine runs."""
        return self.state.model_path

    def check_health(self) -> None:
        """Raise EngineDeadError once a step of the stream driver has failed."""
        if self._streams.failure is not None:
            raise self._streams.failure

    def stats(self) -> EngineStats:
        """Running and waiting requests and free KV blocks; read without the lock (a step may run)."""
        running = len({seq.request_id for seq in list(self.scheduler.running)})
        waiting = len({seq.request_id for seq in list(self.scheduler.waiting)})
        spec = self.spec_decoder.stats.snapshot() if self.spec_decoder is not None else None
        return EngineStats(running, waiting, self.pool.num_free_blocks, self.pool.num_blocks,
                           self.pool.prefix_cache_queries, self.pool.prefix_cache_hits, spec)

    def check_structured_outputs(self, params) -> None:
        """Compile params' grammar now, kept for the add_request of these params (StructuredOutputManager.check);
        ValueError if it does not compile."""
        self.structured_outputs.check(params)

    def reset_prefix_cache(self) -> int:
        """Forget every cached prefix (vLLM's reset_prefix_cache); the number of cached blocks forgotten."""
        with self.step_loop.lock:
            return self.pool.reset_prefix_cache()
