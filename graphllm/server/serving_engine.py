"""What chat and text completions share: model check, limits, SamplingParams, running the engine.

Every request is checked completely before the engine sees it (model name, unsupported fields,
prompt and output length, sampling values), so a stream never has to fail after its 200.
"""

import asyncio
import functools
import itertools
import json
import logging
import math
import threading
from collections.abc import AsyncIterator
from concurrent.futures import Executor, ThreadPoolExecutor
from contextlib import aclosing
from pathlib import Path

from graphllm.runtime.client import EngineClient, EngineDeadError
from graphllm.runtime.outputs import CompletionOutput, RequestOutput
from graphllm.runtime.sampling_params import SamplingParams
from graphllm.runtime.structured_output import StructuredOutputsParams
from graphllm.server.config import GENERATION_DEFAULTS, ServerConfig
from graphllm.server.errors import OpenAIError, bad_request
from graphllm.server.metrics import ServerMetrics
from graphllm.server.protocol import SamplingRequest
from graphllm.server.streaming import merge

logger = logging.getLogger("graphllm.server")
STRUCTURED_FIELDS = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")  # vLLM's older names
STRUCTURED_OUTPUTS_FIELDS = ("json", "regex", "choice", "grammar", "json_object", "disable_any_whitespace")
MIN_LOGPROB = -9999.0  # JSON has no -inf
LOGGED_NAMES, LOGGED_NAME_CHARS = 8, 40  # of the unknown fields a request's warning names
# grammars compiled at once, in threads of their own: a schema can take xgrammar minutes (a 40,000-value enum),
# and in asyncio's default threads, which tokenizing and the engine's steps use, a few such requests stopped
# every other request (s36's fuzzing)
GRAMMAR_THREADS = 2


def generation_defaults(model_path: Path, config: ServerConfig) -> dict:
    """The sampling defaults of requests that leave them out (vLLM's --generation-config): the model's
    generation_config.json ("auto"), none ("vllm") or another folder's, then config.override_generation_config."""
    folder = {"auto": Path(model_path), "vllm": None}.get(config.generation_config,
                                                          Path(config.generation_config).expanduser())
    path = folder / "generation_config.json" if folder is not None else None
    saved = json.loads(path.read_text()) if path is not None and path.is_file() else {}
    defaults = {k: saved[k] for k in GENERATION_DEFAULTS if saved.get(k) is not None}
    return {**defaults, **(config.override_generation_config or {})}


@functools.cache
def max_token_bytes(tokenizer) -> int:
    """A safe upper bound on the UTF-8 bytes of text one token can stand for: the longest token string
    of the vocabulary (special tokens included) times 4, for normalizers that shrink text."""
    longest = max((len(t.encode()) for t in tokenizer.get_vocab()), default=1)
    return 4 * max(longest, 1)


def num_visible_tokens(c: CompletionOutput) -> int:
    """Output tokens that made text: an EOS or stop token id that ended the sequence did not."""
    ended_by_token = c.finish_reason == "stop" and not isinstance(c.stop_reason, str)
    return len(c.token_ids) - (1 if ended_by_token and c.token_ids else 0)


def field_names(fields: dict) -> str:
    """The first few names of `fields`, each cut short: a log line of bounded length whatever the body (a million
    unknown keys logged 12 MB a request, s37's fuzzing)."""
    names = [name if len(name) <= LOGGED_NAME_CHARS else name[:LOGGED_NAME_CHARS] + "..."
             for name in itertools.islice(fields, LOGGED_NAMES)]
    return ", ".join(names) + (", ..." if len(fields) > len(names) else "")


def logprob_value(value: float) -> float:
    return max(value, MIN_LOGPROB) if not math.isnan(value) else MIN_LOGPROB


class Admissions:
    """Engine requests the server has admitted (check_capacity) that the engine does not count as waiting yet:
    between the check and the engine's add_request a request templates, tokenizes and compiles its grammar off
    the event loop, and without this count 40 requests at once all passed a limit of 4 (the fuzzing of s35)."""

    def __init__(self):
        self._pending, self._lock = 0, threading.Lock()  # a Reservation may be finalized on another thread

    @property
    def pending(self) -> int:
        return self._pending

    def reserve(self, num_requests: int) -> "Reservation":
        with self._lock:
            self._pending += num_requests
        return Reservation(self, num_requests)

    def _release(self, num_requests: int) -> None:
        with self._lock:
            self._pending -= num_requests


class Reservation:
    """num_requests admitted engine requests; each is released as the engine takes it (OpenAIServing.generate),
    and whatever is left when the request's handler and stream are gone (a client that left first)."""

    def __init__(self, admissions: Admissions, num_requests: int):
        self._admissions, self._left = admissions, num_requests

    def release(self, num_requests: int = 1) -> None:
        taken = min(num_requests, self._left)
        self._left -= taken
        self._admissions._release(taken)

    def __del__(self):
        self.release(self._left)


def grammar_executor() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(GRAMMAR_THREADS, thread_name_prefix="graphllm-grammar")


class OpenAIServing:
    def __init__(self, engine: EngineClient, config: ServerConfig, metrics: ServerMetrics,
                 admissions: Admissions | None = None, grammars: Executor | None = None):
        self.engine, self.config, self.metrics = engine, config, metrics
        self.admissions = admissions if admissions is not None else Admissions()  # the app shares one
        self.grammars = grammars if grammars is not None else grammar_executor()  # and one of these
        self.defaults = generation_defaults(engine.model_path, config)

    @property
    def max_model_len(self) -> int:
        return self.engine.limits.max_model_len

    def check_model(self, name: str | None) -> None:
        if name and name not in self.config.served_model_names:
            raise OpenAIError(404, f"The model `{name}` does not exist.", "model", "model_not_found")

    def check_sizes(self, req: SamplingRequest) -> None:
        """Bound every field that sizes an allocation, before anything is allocated."""
        limit = self.config.max_n
        for name in ("n", "best_of"):
            value = getattr(req, name)
            if value is not None and not 1 <= value <= limit:
                raise bad_request(f"{name} must be in [1, {limit}] (--max-n), got {value}", name)
        stops = [req.stop] if isinstance(req.stop, str) else req.stop or []
        for name, values in (("stop", stops), ("stop_token_ids", req.stop_token_ids or [])):
            if len(values) > self.config.max_stop:
                raise bad_request(f"{name} may hold at most {self.config.max_stop} entries, got {len(values)}", name)

    def check_capacity(self, num_requests: int) -> Reservation:
        """503 + Retry-After when the engine's queue is full (--max-queued-requests): never unbounded memory.
        Requests admitted here and not yet in the engine count as waiting; the reservation holds this one's
        place until generate hands each of its engine requests over."""
        limit = self.config.max_queued_requests
        if num_requests > limit:  # could never be admitted: the request's fault, not the load's
            raise bad_request(f"this request makes {num_requests} engine requests (one per prompt), more than the "
                              f"server queues at once (--max-queued-requests {limit})", "prompt")
        waiting = self.engine.stats().num_requests_waiting + self.admissions.pending
        if waiting + num_requests > limit:
            raise OpenAIError(503, f"the server is overloaded: {waiting} requests are waiting to be scheduled "
                                   f"(at most {limit}); retry later",
                              code="server_overloaded", headers={"Retry-After": "1"})
        return self.admissions.reserve(num_requests)

    def check_text_length(self, num_bytes: int, param: str) -> None:
        """Refuse text that cannot fit max_model_len before tokenizing it (a 10 MB prompt would take seconds):
        a token covers at most `max_token_bytes` bytes, so num_bytes / max_token_bytes tokens at least."""
        least = num_bytes // max_token_bytes(self.engine.tokenizer)
        if least >= self.max_model_len:
            raise bad_request(f"This model's maximum context length is {self.max_model_len} tokens. However, your "
                              f"{param} holds {num_bytes} bytes of text, at least {least} tokens.", param,
                              "context_length_exceeded")

    def check_supported(self, req: SamplingRequest) -> None:
        """Refuse what we would otherwise silently ignore; unknown fields are only logged (as vLLM)."""
        self.check_sizes(req)
        if req.model_extra:
            logger.warning("ignoring %d unknown request fields: %s", len(req.model_extra), field_names(req.model_extra))
        self.logit_bias(req)  # its keys checked before anything is tokenized
        if req.best_of is not None and req.best_of != req.n:
            raise bad_request("best_of other than n is not supported", "best_of")
        if req.stream_options is not None and not req.stream:
            raise bad_request("stream_options is only allowed with stream=true", "stream_options")
        vocab = self.engine.limits.vocab_size
        if outside := [t for t in req.stop_token_ids or () if not 0 <= t < vocab]:
            raise bad_request(f"stop_token_ids must lie in [0, {vocab}), got {outside}", "stop_token_ids")

    def check_logprobs(self, value: int | None, param: str) -> None:
        if value is not None and not 0 <= value <= self.config.max_logprobs:
            raise bad_request(f"{param} must be in [0, {self.config.max_logprobs}], got {value}", param)

    def resolve_max_tokens(self, num_prompt_tokens: int, asked: int | None, prompt_param: str,
                           max_tokens_param: str = "max_tokens") -> int:
        """The output budget; a prompt or prompt + max_tokens beyond max_model_len is a 400."""
        limit = self.max_model_len
        if num_prompt_tokens >= limit:
            raise bad_request(f"This model's maximum context length is {limit} tokens. However, your "
                              f"{prompt_param} resulted in {num_prompt_tokens} tokens (at most {limit - 1} "
                              "leave room for one output token).", prompt_param, "context_length_exceeded")
        if asked is None:
            return limit - num_prompt_tokens
        if asked < 1:
            raise bad_request(f"{max_tokens_param} must be at least 1, got {asked}", max_tokens_param)
        if num_prompt_tokens + asked > limit:
            raise bad_request(f"This model's maximum context length is {limit} tokens. However, you "
                              f"requested {num_prompt_tokens + asked} tokens ({num_prompt_tokens} in the "
                              f"{prompt_param}, {asked} in the completion). Please reduce the length of "
                              f"the {prompt_param} or completion.", max_tokens_param, "context_length_exceeded")
        return asked

    async def structured_outputs(self, req: SamplingRequest,
                                 forced: StructuredOutputsParams | None = None) -> StructuredOutputsParams | None:
        """The request's grammar from whichever field gives one (response_format, vLLM's structured_outputs or
        guided_*), or forced (a required / named tool call); two sources are a 400. Compiled here once, so a
        grammar that does not compile is a 400 before any answer starts (the engine's compile is then cached)."""
        given = []
        fmt = req.response_format
        if fmt is not None and fmt.type == "json_object":
            given.append(("response_format", StructuredOutputsParams(json_object=True)))
        elif fmt is not None and fmt.type == "json_schema":
            if fmt.json_schema is None or fmt.json_schema.json_schema is None:
                raise bad_request("response_format json_schema needs json_schema.schema", "response_format")
            given.append(("response_format", StructuredOutputsParams(json=fmt.json_schema.json_schema)))
        if req.structured_outputs is not None:
            unknown = sorted(set(req.structured_outputs) - set(STRUCTURED_OUTPUTS_FIELDS))
            if unknown:
                raise bad_request(f"structured_outputs: unsupported fields {unknown}; supported: "
                                  f"{list(STRUCTURED_OUTPUTS_FIELDS)}", "structured_outputs")
            given.append(("structured_outputs", req.structured_outputs))
        for name in STRUCTURED_FIELDS:
            if getattr(req, name) is not None:
                given.append((name, {name.removeprefix("guided_"): getattr(req, name)}))
        if forced is not None:
            given.append(("tool_choice", forced))
        if not given:
            return None
        if len(given) > 1:
            raise bad_request("give one structured output per request; got " + ", ".join(n for n, _ in given),
                              given[1][0])
        name, params = given[0]
        try:
            params = params if isinstance(params, StructuredOutputsParams) else StructuredOutputsParams(**params)
            await asyncio.get_running_loop().run_in_executor(  # compiling: off the loop, in the grammars' threads
                self.grammars, self.engine.check_structured_outputs, params)
        except (ValueError, TypeError) as e:
            raise bad_request(str(e), name) from e
        return params

    def sampling_params(self, req: SamplingRequest, max_tokens: int, logprobs: int | None,
                        structured_outputs: StructuredOutputsParams | None = None) -> SamplingParams:
        given = {k: getattr(req, k) for k in GENERATION_DEFAULTS if getattr(req, k) is not None}
        try:
            return SamplingParams(
                **{**self.defaults, **given}, n=req.n, seed=req.seed, max_tokens=max_tokens,
                min_tokens=req.min_tokens, stop=req.stop, stop_token_ids=req.stop_token_ids,
                ignore_eos=req.ignore_eos, presence_penalty=req.presence_penalty,
                frequency_penalty=req.frequency_penalty, logprobs=logprobs,
                skip_special_tokens=req.skip_special_tokens,
                include_stop_str_in_output=req.include_stop_str_in_output, structured_outputs=structured_outputs,
                logit_bias=self.logit_bias(req))
        except (ValueError, TypeError) as e:
            raise bad_request(str(e), str(e).split(" ", 1)[0]) from e

    def logit_bias(self, req: SamplingRequest) -> dict[int, float] | None:
        """OpenAI's logit_bias (token ids as JSON's string keys) as SamplingParams takes it; a key that is not a
        token id of this model's vocabulary is a 400 naming it."""
        if not req.logit_bias:
            return None
        vocab, bias = self.engine.limits.vocab_size, {}
        for key, value in req.logit_bias.items():
            token = int(key) if key.isascii() and key.isdigit() and len(key) <= 12 else None
            if token is None or token >= vocab:
                shown = key if len(key) <= 40 else key[:40] + "..."
                raise bad_request(f"logit_bias keys must be token ids in [0, {vocab}), got {shown!r}", "logit_bias")
            bias[token] = value
        return bias

    def check_token_ids(self, ids: list[int], param: str) -> None:
        vocab = self.engine.limits.vocab_size
        if not ids:
            raise bad_request(f"{param} must not be empty", param)
        if not all(0 <= t < vocab for t in ids):
            raise bad_request(f"{param}: token ids must lie in [0, {vocab})", param)

    # -- running ----------------------------------------------------------------------------

    async def generate(self, prompt_ids: list[int], params: SamplingParams, request_id: str,
                       admitted: Reservation) -> AsyncIterator[RequestOutput]:
        """engine.stream with metrics; closing this generator aborts the engine request."""
        timer, last = self.metrics.start_request(), None
        try:
            # no await between the release and engine.stream's add_request (its first step): the engine counts
            # the request as waiting from then on
            admitted.release()
            async with aclosing(self.engine.stream(prompt_ids, params, request_id)) as stream:
                async for last in stream:
                    timer.on_output(last)
                    yield last
        except EngineDeadError as e:  # not the request's fault: a 500, and the server goes down (cli/serve.py)
            raise OpenAIError(500, str(e), code="engine_dead") from e
        except ValueError as e:  # the engine refused the request
            raise bad_request(str(e)) from e
        finally:
            timer.finish(last, len(prompt_ids), params.n)

    def generate_all(self, prompts: list[list[int]], params: list[SamplingParams], request_id: str,
                     admitted: Reservation) -> AsyncIterator[tuple[int, RequestOutput]]:
        """One engine request per prompt, interleaved: (prompt index, output)."""
        return merge([self.generate(ids, p, f"{request_id}-{i}", admitted)
                      for i, (ids, p) in enumerate(zip(prompts, params))])

    async def collect(self, prompts: list[list[int]], params: list[SamplingParams], request_id: str,
                      admitted: Reservation) -> list[RequestOutput]:
        """Run every prompt to the end; final outputs in prompt order."""
        final: dict[int, RequestOutput] = {}
        async with aclosing(self.generate_all(prompts, params, request_id, admitted)) as outputs:
            async for i, out in outputs:
                final[i] = out
        return [final[i] for i in range(len(prompts))]
