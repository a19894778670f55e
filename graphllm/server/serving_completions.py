"""POST /v1/completions: text in, text out; prompts as strings, token ids, or lists of either.

A request with p prompts and n completions each has p * n choices; choice i * n + j is the j-th
completion of prompt i (vLLM's numbering).
"""

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi import Request
from fastapi.responses import JSONResponse

from graphllm.runtime.outputs import CompletionOutput
from graphllm.server.errors import OpenAIError, bad_request
from graphllm.server.protocol import (CompletionChoice, CompletionLogprobs, CompletionRequest,
                                      CompletionResponse, random_id, usage)
from graphllm.server.serving_engine import OpenAIServing, Reservation, logprob_value, num_visible_tokens
from graphllm.server.streaming import SSE_DONE, EventStreamResponse, sse, sse_error, until_disconnect

logger = logging.getLogger("graphllm.server")

Prompt = tuple[str | None, list[int]]  # (text if given as text, token ids)


@dataclass
class ChoiceState:
    """What one streamed choice has sent so far."""

    tokens: int = 0
    token_offset: int = 0  # where the next token's text starts (text_offset); text may lag behind
    started: bool = False
    done: bool = False


class ServingCompletions(OpenAIServing):
    async def create(self, req: CompletionRequest, raw: Request):
        self.check_model(req.model)
        self.check_supported(req)
        self.check_logprobs(req.logprobs, "logprobs")
        if req.suffix:
            raise bad_request("suffix is not supported", "suffix")
        if req.echo and req.logprobs is not None:
            raise bad_request("echo with logprobs needs prompt logprobs, which are not supported yet", "echo")
        prompts = await asyncio.to_thread(self.parse_prompts, req.prompt, req.max_tokens)  # off the event loop
        structured = await self.structured_outputs(req)
        params = [self.sampling_params(req, self.resolve_max_tokens(len(ids), req.max_tokens, "prompt"),
                                       req.logprobs, structured) for _, ids in prompts]
        admitted = self.check_capacity(len(prompts))
        request_id, ids = random_id("cmpl"), [ids for _, ids in prompts]
        if req.stream:
            return EventStreamResponse(self.stream(req, prompts, params, request_id, admitted))
        outs = await until_disconnect(raw, self.collect(ids, params, request_id, admitted))
        choices = [self.choice(req, prompts[i], c, i * req.n + c.index)
                   for i, out in enumerate(outs) for c in out.outputs]
        num_output = sum(len(c.token_ids) for out in outs for c in out.outputs)
        response = CompletionResponse(id=request_id, model=self.config.model_name, choices=choices,
                                      usage=usage(sum(map(len, ids)), num_output,
                                                  sum(out.num_cached_tokens for out in outs)))
        return JSONResponse(response.model_dump())

    def parse_prompts(self, prompt, max_tokens: int | None) -> list[Prompt]:
        """The request's prompts, tokenized; each is checked against the context as soon as it is (resolve_max_tokens),
        so a batch past it stops at its first long prompt (256 prompts of 64 KB took 7 s to tokenize before)."""
        if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
            prompt = [prompt]
        if not prompt:
            raise bad_request("prompt must not be empty", "prompt")
        if len(prompt) > self.config.max_prompts:
            raise bad_request(f"prompt may hold at most {self.config.max_prompts} prompts, got {len(prompt)}",
                              "prompt")
        prompts = []
        for p in prompt:
            text, ids = self.parse_prompt(p)
            self.resolve_max_tokens(len(ids), max_tokens, "prompt")
            prompts.append((text, ids))
        return prompts

    def parse_prompt(self, prompt: str | list[int]) -> Prompt:
        if not isinstance(prompt, str):
            self.check_token_ids(prompt, "prompt")
            return None, list(prompt)
        if self.engine.tokenizer is None:
            raise bad_request("this model has no tokenizer: send prompts as token ids", "prompt")
        self.check_text_length(len(prompt.encode()), "prompt")
        ids = list(self.engine.tokenizer.encode(prompt))
        if not ids:
            raise bad_request("prompt must not be empty", "prompt")
        return prompt, ids

    def echo_text(self, prompt: Prompt) -> str:
        text, ids = prompt
        if text is not None:
            return text
        return self.engine.tokenizer.decode(ids) if self.engine.tokenizer is not None else ""

    def choice(self, req: CompletionRequest, prompt: Prompt, c: CompletionOutput, index: int) -> CompletionChoice:
        prefix = self.echo_text(prompt) if req.echo else ""
        logprobs = None
        if req.logprobs is not None:
            logprobs, _ = self.logprobs(c, 0, num_visible_tokens(c), len(prefix))
        return CompletionChoice(index=index, text=prefix + c.text, logprobs=logprobs,
                                finish_reason=c.finish_reason, stop_reason=c.stop_reason)

    def logprobs(self, c: CompletionOutput, start: int, end: int, offset: int) -> tuple[CompletionLogprobs, int]:
        """Legacy completions logprobs of output tokens [start, end) (sampled plus top alternatives),
        their text starting at `offset`; and the offset after them."""
        out = CompletionLogprobs()
        for token_id, entry in zip(c.token_ids[start:end], c.logprobs[start:end]):
            text = token_text(entry[token_id].decoded_token, token_id)
            out.tokens.append(text)
            out.token_logprobs.append(logprob_value(entry[token_id].logprob))
            out.top_logprobs.append({token_text(lp.decoded_token, t): logprob_value(lp.logprob)
                                     for t, lp in sorted(entry.items(), key=lambda kv: kv[1].rank)})
            out.text_offset.append(offset)
            offset += len(text)
        return out, offset

    # -- streaming ---------------------------------------------------------------------------

    async def stream(self, req: CompletionRequest, prompts: list[Prompt], params, request_id: str,
                     admitted: Reservation) -> AsyncIterator[str]:
        created, states = int(time.time()), {}
        include_usage = req.stream_options is not None and req.stream_options.include_usage
        exclude = None if include_usage else {"usage"}
        num_output, cached = 0, {}
        try:
            async for i, out in self.generate_all([ids for _, ids in prompts], params, request_id, admitted):
                cached[i] = out.num_cached_tokens
                for c in out.outputs:
                    state = states.setdefault(i * req.n + c.index, ChoiceState())
                    choice = self.stream_choice(req, prompts[i], c, i * req.n + c.index, state)
                    if choice is not None:
                        num_output += len(c.token_ids) if state.done else 0
                        chunk = CompletionResponse(id=request_id, created=created, model=self.config.model_name,
                                                   choices=[choice])
                        yield sse(chunk, exclude)
            if include_usage:
                num_prompt = sum(len(ids) for _, ids in prompts)
                yield sse(CompletionResponse(id=request_id, created=created, model=self.config.model_name,
                                             choices=[], usage=usage(num_prompt, num_output, sum(cached.values()))))
        except OpenAIError as e:
            yield sse_error(e)
        except Exception as e:
            logger.exception("completion stream %s failed", request_id)
            yield sse_error(OpenAIError(500, f"internal server error: {type(e).__name__}: {e}"))
        yield SSE_DONE

    def stream_choice(self, req: CompletionRequest, prompt: Prompt, c: CompletionOutput, index: int,
                      state: ChoiceState) -> CompletionChoice | None:
        """The chunk choice for what is new in `c`, or None if nothing is."""
        if state.done:
            return None
        text = c.delta_text
        if req.echo and not state.started:
            text = self.echo_text(prompt) + text
        end = num_visible_tokens(c) if c.finished else len(c.token_ids)
        if not text and end == state.tokens and not c.finished:
            return None
        logprobs = None
        if req.logprobs is not None:
            logprobs, state.token_offset = self.logprobs(c, state.tokens, end, state.token_offset)
        state.tokens, state.started, state.done = end, True, c.finished
        return CompletionChoice(index=index, text=text, logprobs=logprobs,
                                finish_reason=c.finish_reason, stop_reason=c.stop_reason)


def token_text(decoded: str | None, token_id: int) -> str:
    return decoded if decoded is not None else f"token_id:{token_id}"
