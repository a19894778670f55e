"""Structured output: a grammar constrains every token a request samples (xgrammar does the grammar work).

    SamplingParams(structured_outputs=StructuredOutputsParams(json=SCHEMA))      (vLLM's names)

A request's StructuredOutputsParams is compiled once when the request is added (GrammarCompiler, which
caches by grammar text), and each of its n sequences gets a GrammarMatcher of its own. Then per step:

    before sampling:  rows whose sequence has a live matcher get its next-token bitmask applied to
                      their logits in place (tokens the grammar forbids become -inf), for host and
                      device sampling alike. The masks are filled on the host (xgrammar's batch
                      matcher, several threads) into a persistent buffer, copied to a persistent
                      device buffer and applied there; only rows with a grammar are touched. Under
                      async scheduling this runs after the previous step's tokens were read back and
                      accepted, while the GPU runs the step whose logits it will mask.
    after a token:    the matcher accepts it (PostProcessor.update_stop); a matcher that has
                      terminated (grammar complete, stop token accepted) finishes the sequence

Reasoning models (reasoning_end, set by the server under a --reasoning-parser when the answer starts
inside reasoning): the grammar waits, and the text is free, until the output holds reasoning_end (e.g.
"</think>"); the tokens after it are constrained.

Logprobs are of the constrained logits, as in vLLM (the bitmask is applied before the sampler). A
sequence with a grammar never runs queued decode steps (StepLoop._decode_steps): their tokens are
argmaxes taken on the device, where no mask can reach them. Under speculative decoding each of a verify
step's rows is masked by the grammar as it stands after the proposals before it (constrain_drafts), so a
proposal the grammar forbids is rejected and the target's token there obeys the grammar.
"""

import json
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

logger = logging.getLogger(__name__)

KINDS = ("json", "regex", "choice", "grammar", "json_object")
FIELD_TYPES = {"json": (dict, str, type(None)), "regex": (str, type(None)), "grammar": (str, type(None)),
               "json_object": (bool, type(None)), "disable_any_whitespace": bool, "reasoning_end": (str, type(None))}
FIELD_TYPE_NAMES = {"json": "a schema (object or text)", "regex": "text", "grammar": "text",
                    "json_object": "a boolean", "disable_any_whitespace": "a boolean", "reasoning_end": "text"}
OBJECT_SCHEMA = '{"type": "object"}'  # json_object: OpenAI's JSON mode answers an object (xgrammar's builtin
# JSON grammar also takes arrays and scalars)


@dataclass
class StructuredOutputsParams:
    """What a request's output must match: exactly one of json (a JSON schema, dict or text), regex,
    choice (one of these strings), grammar (EBNF, xgrammar's / GBNF syntax) and json_object (any JSON
    object). disable_any_whitespace: JSON without free whitespace between tokens (vLLM's option)."""

    json: dict | str | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False
    reasoning_end: str | None = None  # graphllm's: free text until the output holds this, then the grammar

    def __post_init__(self) -> None:
        given = [kind for kind in KINDS if getattr(self, kind) not in (None, False)]
        if len(given) != 1:
            raise ValueError(f"structured_outputs needs exactly one of {', '.join(KINDS)}; got "
                             f"{', '.join(given) or 'none'}")
        if self.choice is not None and (not isinstance(self.choice, list) or not self.choice
                                        or not all(isinstance(c, str) for c in self.choice)):
            raise ValueError("structured_outputs choice must be a non-empty list of strings")
        for name, types in FIELD_TYPES.items():  # a request's JSON reaches here as it was sent
            if not isinstance(getattr(self, name), types):
                raise ValueError(f"structured_outputs {name} must be {FIELD_TYPE_NAMES[name]}, got "
                                 f"{type(getattr(self, name)).__name__}")

    @property
    def kind(self) -> str:
        return next(kind for kind in KINDS if getattr(self, kind) not in (None, False))


def choice_grammar(choices: list[str]) -> str:
    """An EBNF grammar whose language is exactly the given strings."""
    return "root ::= " + " | ".join(json.dumps(c) for c in choices)  # JSON string escapes are EBNF's


def _compile(compiler, params: StructuredOutputsParams) -> Any:
    """params' grammar compiled by xgrammar's GrammarCompiler."""
    kind, any_whitespace = params.kind, not params.disable_any_whitespace
    if kind == "json":
        schema = params.json if isinstance(params.json, str) else json.dumps(params.json)
        return compiler.compile_json_schema(schema, any_whitespace=any_whitespace)
    if kind == "json_object":
        return compiler.compile_json_schema(OBJECT_SCHEMA, any_whitespace=any_whitespace)
    if kind == "regex":
        return compiler.compile_regex(params.regex)
    return compiler.compile_grammar(params.grammar if kind == "grammar" else choice_grammar(params.choice))


# xgrammar's cache of compiled grammars, bounded as vLLM bounds it (VLLM_XGRAMMAR_CACHE_MB, 512): unbounded, distinct
# large schemas grew the server without limit (a 40,000-value enum holds ~73 MB). Past it the least recently used
# grammar is dropped, and a request that needs it again compiles it again.
GRAMMAR_CACHE_BYTES = 512 * 2**20
# grammars compiled by check() for requests not yet added (the server checks in its grammar threads, then adds on
# the event loop); past this many the oldest are forgotten, and its request, if it comes, compiles again
CHECKED_KEPT = 256


class StructuredOutputManager:
    """Compiles requests' grammars and constrains their logits: one per engine, built on first use (the
    tokenizer's vocabulary is read then)."""

    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: list[int]):
        self.tokenizer, self.vocab_size, self.stop_token_ids = tokenizer, vocab_size, list(stop_token_ids)
        self._compiler = self._batch = self._host = self._device = None
        self._checked: OrderedDict[int, tuple] = OrderedDict()  # id(params) -> (params, its compiled grammar)
        self._checked_lock = threading.Lock()

    def _grammar_compiler(self):
        if self._compiler is None:
            import xgrammar as xgr
            if self.tokenizer is None:
                raise ValueError("structured output needs the model's tokenizer, and this model has none")
            info = xgr.TokenizerInfo.from_huggingface(self.tokenizer, vocab_size=self.vocab_size,
                                                      stop_token_ids=self.stop_token_ids)
            self._compiler = xgr.GrammarCompiler(info, cache_limit_bytes=GRAMMAR_CACHE_BYTES)
        return self._compiler

    def use_vocabulary(self, token_texts: list[str]) -> None:
        """Match grammars against these token texts (one per id, raw) instead of the tokenizer's: for a
        model folder without a tokenizer (the benchmarks' random-weight presets)."""
        import xgrammar as xgr
        info = xgr.TokenizerInfo(token_texts, xgr.VocabType.RAW, vocab_size=self.vocab_size,
                                 stop_token_ids=self.stop_token_ids)
        self._compiler = xgr.GrammarCompiler(info, cache_limit_bytes=GRAMMAR_CACHE_BYTES)

    def compile(self, params: StructuredOutputsParams) -> Any:
        """The xgrammar CompiledGrammar of params; ValueError naming the field when it does not compile, or
        when no token can start it (its sequences would have nothing to sample)."""
        compiler = self._grammar_compiler()
        try:
            compiled = _compile(compiler, params)
        except (RuntimeError, ValueError, TypeError) as exc:  # xgrammar reports parse errors as RuntimeError
            reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
            raise ValueError(f"structured_outputs {params.kind} does not compile: {reason}") from None
        if not self._allows_a_first_token(compiled):
            raise ValueError(f"structured_outputs {params.kind} admits no output: no token of this model's "
                             "vocabulary (not even end-of-text) can start it")
        return compiled

    def check(self, params: StructuredOutputsParams) -> None:
        """compile(params) ahead of its request (the server, in its grammar threads), and keep the result for
        compiled_for: adding the request then compiles nothing, even where xgrammar's bounded cache has dropped
        the grammar meanwhile (which would compile it on the server's event loop)."""
        compiled = self.compile(params)
        with self._checked_lock:
            self._checked[id(params)] = (params, compiled)
            while len(self._checked) > CHECKED_KEPT:
                self._checked.popitem(last=False)

    def compiled_for(self, params: StructuredOutputsParams) -> Any:
        """params' compiled grammar: the one check() kept for this very object, else compile(params)."""
        with self._checked_lock:
            kept = self._checked.pop(id(params), None)
        return kept[1] if kept is not None and kept[0] is params else self.compile(params)

    def _allows_a_first_token(self, compiled) -> bool:
        import xgrammar as xgr
        mask = xgr.allocate_token_bitmask(1, self.vocab_size)  # [1, V / 32] int32
        xgr.GrammarMatcher(compiled).fill_next_token_bitmask(mask)
        return bool(mask.any())

    def matcher(self, compiled) -> Any:
        import xgrammar as xgr
        return xgr.GrammarMatcher(compiled)

    def constrain(self, logits: torch.Tensor, seqs: list) -> None:
        """Mask, in place, the rows of logits ([len(seqs), V]) whose sequence's grammar is live."""
        rows = [i for i, seq in enumerate(seqs) if grammar_live(seq)]
        if not rows:
            return
        import xgrammar as xgr
        host, _ = self._buffers(logits.shape[0], logits.device)
        if self._batch is None:
            self._batch = xgr.BatchGrammarMatcher()
        self._batch.batch_fill_next_token_bitmask([seqs[i].grammar for i in rows], host, indices=rows)
        self._apply(logits, rows)

    def constrain_drafts(self, logits: torch.Tensor, seqs: list, proposals: list[list[int]]) -> None:
        """Mask, in place, a verify step's rows (logits [sum of 1 + k, V], each sequence's 1 + k rows in turn):
        row j of a sequence whose grammar is live gets its grammar's mask after proposals[:j]. The matcher
        walks the proposals and is rolled back afterwards; the tokens a verify step emits are accepted
        later, one by one (PostProcessor.update_stop), like sampled ones. Past a proposal the grammar
        refuses, rows stay unmasked: that proposal's own row forbids it, so no later row is ever used."""
        host, _ = self._buffers(logits.shape[0], logits.device)
        rows, first = [], 0
        for seq, tokens in zip(seqs, proposals):
            if grammar_live(seq):
                rows += self._fill_along(seq.grammar, tokens, host, first)
            first += 1 + len(tokens)
        if rows:
            self._apply(logits, rows)

    def _apply(self, logits: torch.Tensor, rows: list[int]) -> None:
        """Copy the filled host masks over and apply them to those rows of logits, in place."""
        import xgrammar as xgr
        n = logits.shape[0]
        self._device[:n].copy_(self._host[:n], non_blocking=True)
        xgr.apply_token_bitmask_inplace(logits, self._device[:n], vocab_size=self.vocab_size, indices=rows)

    @staticmethod
    def _fill_along(matcher, tokens: list[int], host: torch.Tensor, first: int) -> list[int]:
        """Fill host rows first.. with matcher's masks along tokens; the rows filled."""
        rows, walked = [], 0
        for j in range(len(tokens) + 1):
            matcher.fill_next_token_bitmask(host, first + j)
            rows.append(first + j)
            if j == len(tokens) or not matcher.accept_token(tokens[j]):
                break
            walked += 1
            if matcher.is_terminated():
                break  # the grammar ends at this proposal: the rows after it are never used
        if walked:
            matcher.rollback(walked)
        return rows

    def _buffers(self, rows: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The host bitmask (pinned where a GPU is) and its device copy, [capacity, V / 32] int32 each,
        kept between steps and grown to the next power of two when a step has more rows."""
        if self._host is None or self._host.shape[0] < rows or self._device.device != device:
            import xgrammar as xgr
            capacity = 1 << max(rows - 1, 0).bit_length()
            host = xgr.allocate_token_bitmask(capacity, self.vocab_size)
            self._host = host.pin_memory() if device.type == "cuda" else host
            self._device = self._host.to(device) if device.type == "cuda" else self._host
        return self._host, self._device


def grammar_live(seq) -> bool:
    """Whether seq's grammar constrains its next token: it has one, not terminated, and past any
    reasoning (the output holds reasoning_end; checked until it does, then remembered)."""
    if seq.grammar is None or seq.grammar.is_terminated():
        return False
    if not seq.grammar_open:
        end = seq.params.structured_outputs.reasoning_end
        seq.grammar_open = end is None or (seq.detokenizer is not None and end in seq.detokenizer.output_text)
    return seq.grammar_open


def accept(seq, token: int) -> str | None:
    """Feed a sampled token to seq's matcher (if its grammar is live): "stop" once the grammar terminated,
    "abort" if the matcher refused the token (a bug: the mask should have forbidden it), else None."""
    if not grammar_live(seq):
        return None
    if not seq.grammar.accept_token(token):
        logger.error("request %s: the grammar refused token %d; the sequence is stopped", seq.request_id, token)
        return "abort"
    return "stop" if seq.grammar.is_terminated() else None
