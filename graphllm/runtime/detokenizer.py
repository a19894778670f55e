"""Incremental detokenization of one request's output, with stop-string detection.

Text is decoded *in the context of the prompt*: the stream is primed with the last few
prompt tokens, so the first output token decodes as it would inside the full sequence
(``decode(prompt + output) == decode(prompt) + output_text``). For byte-level BPE and
ordinary text this is exactly ``tokenizer.decode(output_ids)``; for sentencepiece-style ("▁") tokenizers it
differs only in keeping the first output token's leading space, which a lone
``decode(output_ids)`` strips.

Fast tokenizers use ``tokenizers.decoders.DecodeStream``; tokenizers without a Rust
backend fall back to the prefix-offset/read-offset method over ``tokenizer.decode``.
Both hold back text that ends in an incomplete UTF-8 sequence ('\\ufffd') until a later
token completes it; bytes still incomplete when generation ends are never emitted. A prompt that
ends inside a character keeps its cut bytes: they become output text only where an output token
completes the character.
``clean_up_tokenization_spaces`` is not applied (it is not incremental).
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

_INCOMPLETE = "\ufffd"  # what a lossy UTF-8 decode yields for a cut multi-byte sequence
_MIN_CONTEXT, _MAX_CONTEXT = 4, 24  # prompt tokens decoded as context for the first output token
_INVALID_PREFIX = "Invalid prefix"  # DecodeStream's error when a decoder rewrites old text


def find_stop(
    text: str, num_new_chars: int, stop: Sequence[str], include_stop_str_in_output: bool
) -> tuple[str, int] | None:
    """Find a stop string that ends within the last ``num_new_chars`` characters of ``text``.

    Only the tail ``num_new_chars + len(stop_str) - 1`` is searched, since the text before
    it was already searched. Among several matches the one ending first wins (ties: the
    longer one), so the result does not depend on how tokens were batched. Returns
    ``(stop_str, cut)`` where ``text[:cut]`` is the output to keep, or None.
    """
    best: tuple[int, int, str] | None = None  # (end, start, stop_str)
    for stop_str in stop:
        start = text.find(stop_str, max(0, len(text) - num_new_chars - len(stop_str) + 1))
        if start >= 0 and (best is None or (start + len(stop_str), start) < best[:2]):
            best = (start + len(stop_str), start, stop_str)
    if best is None:
        return None
    end, start, stop_str = best
    return stop_str, end if include_stop_str_in_output else start


def _prompt_context(decode, prompt_ids: Sequence[int]) -> tuple[list[int], str | None]:
    """The shortest prompt suffix of ``_MIN_CONTEXT``..``_MAX_CONTEXT`` tokens whose text has
    no '\\ufffd', i.e. starts and ends on character boundaries, with that text. When there is
    none (the prompt ends inside a character, or holds junk bytes) returns the longest suffix
    and None: the caller then steps through it like output, discarding the text."""
    tail = [int(t) for t in prompt_ids[-_MAX_CONTEXT:]]
    for n in range(min(_MIN_CONTEXT, len(tail)), len(tail) + 1):
        window = tail[len(tail) - n :]
        text = decode(window)
        if _INCOMPLETE not in text:
            return window, text
    return tail, None


def _backend_of(tokenizer) -> Tokenizer | None:
    """The raw ``tokenizers.Tokenizer`` behind a transformers tokenizer, if it has one."""
    if isinstance(tokenizer, Tokenizer):
        return tokenizer
    for name in ("backend_tokenizer", "_tokenizer"):
        backend = getattr(tokenizer, name, None)
        if isinstance(backend, Tokenizer):
            return backend
    return None


class _FastStream:
    """``DecodeStream`` primed with the prompt tail; ``step`` returns new text ('' if none)."""

    def __init__(self, backend: Tokenizer, prompt_ids: Sequence[int], skip_special_tokens: bool):
        self._backend = backend
        self._skip = skip_special_tokens
        self._pending: list[int] = []  # fed tokens whose text the stream still holds back
        self._held = ""  # the text of a prompt's cut character (below)
        window, text = _prompt_context(
            lambda ids: backend.decode(ids, skip_special_tokens=self._skip), prompt_ids
        )
        if text is not None:
            self._stream = DecodeStream(ids=window, skip_special_tokens=self._skip)
            return
        self._stream = DecodeStream(skip_special_tokens=self._skip)
        for token_id in window:  # keeps a clean prefix: a cut character comes out whole
            self.step([token_id])
        # the prompt's own cut character, if it ends inside one: not output text unless an output token completes it
        self._held = backend.decode(self._pending, skip_special_tokens=self._skip) if self._pending else ""

    def step(self, token_ids: list[int]) -> str:
        """Feed tokens; return the text they complete."""
        text = self._step(token_ids)
        if text and self._held:
            text, self._held = text.removeprefix(self._held), ""
        return text

    def _step(self, token_ids: list[int]) -> str:
        try:
            text = self._stream.step(self._backend, token_ids)
        except Exception as exc:  # tokenizers raises a bare Exception
            if not str(exc).startswith(_INVALID_PREFIX):
                raise
            # A non-monotonic decoder changed text already emitted; restart without context.
            self._stream = DecodeStream(skip_special_tokens=self._skip)
            text = self._stream.step(self._backend, self._pending + token_ids)
        if text is None:
            self._pending.extend(token_ids)
            return ""
        self._pending.clear()
        return text


class _SlowStream:
    """Prefix-offset/read-offset decoding over ``tokenizer.decode`` for tokenizers without
    a Rust backend. Context is the last emitted chunk, so each step decodes a few tokens."""

    def __init__(self, tokenizer, prompt_ids: Sequence[int], skip_special_tokens: bool):
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        window, text = _prompt_context(self._decode, prompt_ids)
        self._ids = window if text is not None else []  # context tokens, then pending ones
        self._read = len(self._ids)  # self._ids[:self._read] is the context
        self._prefix = text or ""  # decode of the context
        self._held = ""
        if text is None:
            for token_id in window:
                self.step([token_id])
            self._held = self._decode(self._ids)[len(self._prefix):]  # as _FastStream's

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(
            ids, skip_special_tokens=self._skip, clean_up_tokenization_spaces=False
        )

    def step(self, token_ids: list[int]) -> str:
        """Feed tokens; return the text they complete."""
        self._ids.extend(token_ids)
        text = self._decode(self._ids)
        if len(text) <= len(self._prefix) or text.endswith(_INCOMPLETE):
            return ""
        new_text = text[len(self._prefix) :]
        del self._ids[: self._read]
        self._read = len(self._ids)
        self._prefix = self._decode(self._ids)
        if self._held:
            new_text, self._held = new_text.removeprefix(self._held), ""
        return new_text


class IncrementalDetokenizer:
    """Turns a growing list of output token ids into text, one step at a time, and finds stop strings."""

    def __init__(
        self,
        tokenizer,
        prompt_token_ids: Sequence[int],
        *,
        skip_special_tokens: bool = True,
        stop: Sequence[str] = (),
        include_stop_str_in_output: bool = False,
    ):
        if isinstance(stop, str) or not all(stop or ()):
            raise ValueError(f"stop must be a sequence of non-empty strings, got {stop!r}")
        self._stop = tuple(stop or ())
        self._include_stop = include_stop_str_in_output
        self._hold_back = max(map(len, self._stop), default=1) - 1
        backend = _backend_of(tokenizer)
        if backend is not None:
            self._stream = _FastStream(backend, prompt_token_ids, skip_special_tokens)
        else:
            self._stream = _SlowStream(tokenizer, prompt_token_ids, skip_special_tokens)
        self._text = ""
        self._sent = 0  # characters of self._text already handed out by next_delta
        self._stopped_on: str | None = None

    @property
    def output_text(self) -> str:
        """The full (possibly cut) text so far."""
        return self._text

    @property
    def stopped_on(self) -> str | None:
        """The stop string found so far, or None."""
        return self._stopped_on

    def update(self, new_token_ids: Sequence[int], check_stop: bool = True) -> str | None:
        """Append generated tokens. Returns the stop string if one now appears in the output text
        (the text is then cut exactly: before the stop string, or after it when include_stop_str_in_output),
        else None. After a stop was found, further updates are an error.

        check_stop=False (the tokens within a request's min_tokens) appends their text without looking for
        stop strings; later updates search only their own text and the len(stop) - 1 characters before it,
        so a stop string must end past those tokens (vLLM's rule)."""
        if self._stopped_on is not None:
            raise RuntimeError(f"update() after stop string {self._stopped_on!r} was found")
        token_ids = [int(t) for t in new_token_ids]
        new_text = self._stream.step(token_ids) if token_ids else ""
        if not new_text:
            return None
        self._text += new_text
        if not check_stop:
            return None
        found = find_stop(self._text, len(new_text), self._stop, self._include_stop)
        if found is None:
            return None
        self._stopped_on, cut = found
        self._text = self._text[:cut]
        return self._stopped_on

    def next_delta(self, finished: bool) -> str:
        """Text not yet handed out. While not finished, holds back the last (longest stop string length - 1)
        characters so that a stop string arriving later is never streamed partially; returns everything
        that remains when finished. Nothing is held back once a stop string was found: the text is final."""
        end = len(self._text)
        if not finished and self._stopped_on is None:
            end -= self._hold_back
        if end <= self._sent:
            return ""
        delta = self._text[self._sent : end]
        self._sent = end
        return delta
