"""Engine: the Python API. Requests in, RequestOutputs out, one continuous batch underneath.

    engine = Engine.from_pretrained("path/to/hf-folder")      # or no path: the demo model
    outs = engine.generate(["Hello"], SamplingParams(max_tokens=32))
    async for out in engine.stream("Hello", params): ...

`generate` drives the loop itself; `stream` shares one background driver task among all
concurrent streams of an event loop (continuous batching across callers).
"""

import asyncio
import itertools
import threading
from collections.abc import AsyncIterator, Sequence as Seq
from typing import NamedTuple

import torch
from tqdm.auto import tqdm

from graphllm.config import EngineConfig
from graphllm.runtime.outputs import RequestOutput
from graphllm.runtime.requests import Request
from graphllm.runtime.sampler import Sampler, SamplingRow, plain_greedy
from graphllm.runtime.sampling_params import SamplingParams
from graphllm.runtime.sequence import Sequence
from graphllm.runtime.setup import build_runtime
from graphllm.runtime.stopping import check_stop, reached_length

Prompt = str | list[int]


class InFlight(NamedTuple):
    """A launched step whose sampled tokens are not read back yet (async scheduling)."""

    seqs: list[Sequence]  # row i of tokens is seqs[i]'s PENDING token
    tokens: torch.Tensor  # [R] on the device: the next step's inputs are copied from here
    host: tuple[torch.Tensor, torch.cuda.Event | None]  # their copy on the host, and when it is done


class Engine:
    def __init__(self, config: EngineConfig):
        self.config = config
        rt = build_runtime(config)
        self.model, self.tokenizer, self.state = rt.model, rt.tokenizer, rt.state
        self.pool, self.scheduler, self.runner = rt.pool, rt.scheduler, rt.runner
        self.sampler = Sampler()
        self.requests: dict[str, Request] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()  # step() may run in a worker thread while requests arrive
        self._token_texts: dict[int, str] = {}  # token id -> its decoded text, for logprobs
        self._queues: dict[str, asyncio.Queue] = {}
        self._driver: asyncio.Task | None = None
        # async scheduling needs a backend whose per-step planning cannot disturb the step in flight,
        # and gives way to queued decode steps (num_decode_steps > 1), which overlap the host their own way
        self.async_scheduling: bool = (config.async_scheduling and config.num_decode_steps == 1
                                       and not self.runner.backend.plans_on_host)
        self._in_flight: InFlight | None = None  # the step whose tokens are still on the device

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

    # -- requests ---------------------------------------------------------------------------

    def add_request(self, prompt: Prompt, params: SamplingParams | None = None,
                    request_id: str | None = None) -> str:
        params = params or SamplingParams()
        prompt_text, prompt_ids = self._tokenize(prompt)
        self._check_length(prompt_ids)
        request_id = request_id or f"req-{next(self._ids)}"
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        request = Request(request_id, prompt_text, prompt_ids, params)
        request.seqs = [self._new_sequence(request, i) for i in range(params.n)]
        with self._lock:
            self.requests[request_id] = request
            for seq in request.seqs:
                self.scheduler.add(seq)
        return request_id

    def abort(self, request_id: str) -> None:
        """Stop a request now and free its KV blocks; unknown or finished ids are ignored."""
        with self._lock:
            request = self.requests.pop(request_id, None)
            for seq in request.seqs if request else []:
                if not seq.is_finished:
                    self.scheduler.finish(seq, "abort")

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

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

    def _check_length(self, prompt_ids: list[int]) -> None:
        if len(prompt_ids) >= self.state.max_model_len:
            raise ValueError(f"prompt has {len(prompt_ids)} tokens; max_model_len is "
                             f"{self.state.max_model_len} (prompt + at least one output token)")

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
        Under async scheduling (`_step_async`) the tokens a call reports are those of the step
        before: each call launches one step and reads back the previous one.
        """
        with self._lock:
            if self.async_scheduling:
                return self._step_async()
            batch = self.scheduler.schedule()
            if not batch:
                return []
            num_steps = self._decode_steps(batch)
            if num_steps > 1:
                self._run_decode_steps(batch, num_steps)
            else:
                logits = self.runner.execute(batch)
                sampling = [s.seq for s in batch if s.samples]
                for seq, num_new in batch:
                    seq.num_computed_tokens += num_new
                if sampling:
                    self._sample(logits, sampling)
            touched = (self.requests.get(rid) for rid in {s.seq.request_id for s in batch})
            return [self._output(r) for r in touched if r is not None and (r.report_progress or r.finished)]

    def _step_async(self) -> list[RequestOutput]:
        """Launch step N + 1, then read back step N: the host's work for one step overlaps the GPU's
        work for the other (what vLLM calls async scheduling, SGLang its overlap scheduler).

        1. Schedule N + 1 while N's tokens are still on the device. Each sequence N samples holds
           a PENDING token; as an input of N + 1 it is copied on the device from N's tokens.
        2. Launch N + 1 (inputs, graph replay): queued behind N, not waited for.
        3. Read back N's tokens (N has finished or nearly), append them, check stops, detokenize.
           A sequence that stopped at N wastes its row of N + 1; its blocks are freed now, and the
           stream order keeps N + 1's writes to them before any later step's.
        4. Sample N + 1 on the device and keep its tokens in flight. Rows that need host lists
           (logprobs, penalties) are sampled now instead, which waits for N + 1.
        A sequence whose pending token is its last by length is not scheduled again (`stopping`).
        """
        batch = self.scheduler.schedule()
        previous, self._in_flight = self._in_flight, None
        logits, sampling = None, []
        if batch:
            sampling = [s.seq for s in batch if s.samples]
            logits = self.runner.execute(batch, previous.tokens if previous else None)
            for seq, num_new in batch:
                seq.num_computed_tokens += num_new
        advanced = self._read_back(previous) if previous else []
        live = [i for i, seq in enumerate(sampling) if not seq.is_finished]
        if live:
            # Rows of sequences that finished at N are sampled too, and dropped: selecting the
            # others on the device would wait for N + 1 (an index built on the host).
            tokens = self.sampler.sample_on_device(logits, self._sampling_rows(sampling))
            if tokens is None:
                if len(live) < len(sampling):
                    logits, sampling = logits[live], [sampling[i] for i in live]
                self._sample(logits, sampling)
                advanced += sampling
            else:
                self._in_flight = InFlight(sampling, tokens, self._to_host(tokens))
                for row, seq in enumerate(sampling):
                    if seq.is_finished:
                        continue
                    seq.append_pending(row)
                    seq.stopping = reached_length(seq, self.state.max_model_len)
        touched = (self.requests.get(rid) for rid in {seq.request_id for seq in advanced})
        return [self._output(r) for r in touched if r is not None and (r.report_progress or r.finished)]

    def _to_host(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event | None]:
        """A copy of tokens on the host, queued now, and the event that marks it done (None on CPU)."""
        if not tokens.is_cuda:
            return tokens, None
        host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
        host.copy_(tokens, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        return host, done

    def _wait_for_tokens(self, step: InFlight) -> list[int]:
        host, done = step.host
        if done is not None:
            done.synchronize()
        return host.tolist()

    def _read_back(self, step: InFlight) -> list[Sequence]:
        """Wait for an in-flight step's tokens and give each to its sequence (unless it finished meanwhile)."""
        advanced = []
        for seq, token in zip(step.seqs, self._wait_for_tokens(step)):
            if seq.pending_row is None:  # finished or aborted since: the token is dropped
                continue
            seq.resolve(token)
            self._update_stop(seq, token)
            advanced.append(seq)
        return advanced

    def _decode_steps(self, batch) -> int:
        """How many decode steps this batch may run back to back (config.num_decode_steps at most).

        Only a batch of decoding sequences that are all plain greedy (argmax, no logprobs,
        penalties or pending min_tokens) qualifies: their next inputs are the previous argmax,
        known on the device. No sequence is stepped past its max_tokens or max_model_len, and the
        KV blocks for every step must be free now. A sequence that stops on the way (EOS, stop
        token or string) wastes the remaining steps' compute; their tokens are dropped.
        """
        steps = self.config.num_decode_steps
        if steps == 1 or self.runner.backend.plans_on_host or not all(s.num_new_tokens == 1 and s.samples
                                                                        for s in batch):
            return 1  # a backend that plans per step (FlashInfer) cannot have steps queued
        limit = self.state.max_model_len
        for s in batch:
            seq, params = s.seq, s.seq.params
            if not plain_greedy(params) or self._min_tokens_stop_ids(seq):
                return 1
            steps = min(steps, limit - seq.num_tokens)
            if params.max_tokens is not None:
                steps = min(steps, params.max_tokens - seq.num_output_tokens)
        if steps > 1 and sum(self.pool.blocks_needed(s.seq, steps) for s in batch) > self.pool.num_free_blocks:
            return 1
        return max(steps, 1)

    def _run_decode_steps(self, batch, num_steps: int) -> None:
        for s in batch:
            self.pool.allocate(s.seq, num_steps)
        tokens = self.runner.execute_decode_steps(batch, num_steps)  # [num_steps][B]
        seqs = [s.seq for s in batch]
        for row in tokens:
            for seq, token in zip(seqs, row):
                if not seq.is_finished:
                    seq.num_computed_tokens += 1
                    seq.append_token(token)
                    self._update_stop(seq, token)

    def _sampling_rows(self, seqs: list[Sequence]) -> list[SamplingRow]:
        # The rows hold the sequences' own token lists (no copies): the sampler only reads them.
        return [SamplingRow(s.params, s.prompt_token_ids, s.output_token_ids, s.generator,
                            self._min_tokens_stop_ids(s)) for s in seqs]

    def _sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> None:
        out = self.sampler(logits, self._sampling_rows(seqs))
        for seq, token, logprobs in zip(seqs, out.token_ids, out.logprobs):
            seq.append_token(token)
            if logprobs is not None:
                seq.logprobs.append(self._decode_logprobs(logprobs))
            self._update_stop(seq, token)

    def _min_tokens_stop_ids(self, seq: Sequence) -> tuple[int, ...]:
        params = seq.params
        if seq.num_output_tokens >= params.min_tokens:
            return ()  # min_tokens reached: the sampler forbids nothing
        eos = () if params.ignore_eos else tuple(self.state.eos_token_ids)
        return eos + tuple(params.stop_token_ids or ())

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

    def _update_stop(self, seq: Sequence, token: int) -> None:
        stop = check_stop(seq, token, self.state.eos_token_ids, self.state.max_model_len)
        if seq.detokenizer is not None and (stop is None or stop[0] == "length"):
            stop_str = seq.detokenizer.update([token])  # EOS and stop tokens never become text
            if stop_str is not None:
                stop = ("stop", stop_str)
        if stop is not None:
            self.scheduler.finish(seq, stop[0])
            seq.stop_reason = stop[1]

    def _output(self, request: Request) -> RequestOutput:
        out = request.snapshot()
        if out.finished:
            self.requests.pop(request.request_id, None)
        return out

    # -- entry points -----------------------------------------------------------------------

    def generate(self, prompts: Prompt | Seq[Prompt],
                 params: SamplingParams | Seq[SamplingParams] | None = None,
                 use_tqdm: bool = False) -> list[RequestOutput]:
        """Run prompts to completion; outputs come back in prompt order."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params_list = params if isinstance(params, (list, tuple)) else [params] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError(f"got {len(params_list)} SamplingParams for {len(prompts)} prompts")
        ids = [self.add_request(p, sp) for p, sp in zip(prompts, params_list)]
        for request_id in ids:  # only the final outputs are kept: skip the snapshots before them
            self.requests[request_id].report_progress = False
        finished: dict[str, RequestOutput] = {}
        with tqdm(total=len(ids), disable=not use_tqdm, desc="generate") as bar:
            while len(finished) < len(ids):
                for out in self.step():
                    if out.finished:
                        finished[out.request_id] = out
                        bar.update(1)
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
        request_id = self.add_request(prompt, params, request_id)
        queue: asyncio.Queue = asyncio.Queue()
        self._queues[request_id] = queue
        self._ensure_driver()
        try:
            while True:
                out = await queue.get()
                if isinstance(out, BaseException):
                    raise out
                yield out
                if out.finished:
                    return
        finally:
            self._queues.pop(request_id, None)
            self.abort(request_id)

    def _ensure_driver(self) -> None:
        if self._driver is None or self._driver.done():
            self._driver = asyncio.get_running_loop().create_task(self._drive())

    async def _drive(self) -> None:
        """Step while any stream waits; hand each output to its stream's queue."""
        try:
            while self._queues and self.has_unfinished_requests():
                for out in await asyncio.to_thread(self.step):
                    if out.request_id in self._queues:
                        self._queues[out.request_id].put_nowait(out)
                await asyncio.sleep(0)
        except Exception as e:  # surface engine failures in every waiting stream
            for queue in self._queues.values():
                queue.put_nowait(e)
            raise
