"""Tests for graphllm.runtime.detokenizer.

Three tiny tokenizers are trained here (nothing is downloaded): a GPT-2-style byte-level
BPE, a Metaspace ("▁") BPE, and a Llama-style BPE with byte fallback and a Strip decoder.
"""

import json
import random

import pytest
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from graphllm.runtime.detokenizer import IncrementalDetokenizer, find_stop

_WORDS = (
    "the quick brown fox jumps over a lazy dog while streaming tokens to the client "
    "café naïve résumé façade über straße 你好 世界 中文 日本語 한국어 🙂 🚀 👍🏽 🎉 ❤️"
).split()
_SPECIALS = ["<unk>", "<s>", "</s>", "<|user|>"]


def _corpus(n: int = 400) -> list[str]:
    rng = random.Random(1234)
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 12))) for _ in range(n)]


def _wrap(raw: Tokenizer) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(
        tokenizer_object=raw,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        additional_special_tokens=["<|user|>"],
    )


def _byte_level() -> PreTrainedTokenizerFast:
    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=340,  # small, so most CJK and emoji stay split across byte tokens
        special_tokens=_SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    raw.train_from_iterator(_corpus(), trainer)
    return _wrap(raw)


def _metaspace() -> PreTrainedTokenizerFast:
    raw = Tokenizer(models.BPE(unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    raw.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=_SPECIALS, show_progress=False)
    raw.train_from_iterator(_corpus(), trainer)
    return _wrap(raw)


def _llama_style() -> PreTrainedTokenizerFast:
    raw = Tokenizer(models.BPE(unk_token="<unk>"))
    raw.normalizer = normalizers.Sequence(
        [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=_SPECIALS, limit_alphabet=40, show_progress=False
    )
    raw.train_from_iterator(_corpus(), trainer)
    data = json.loads(raw.to_str())  # add <0xNN> tokens: rare characters fall back to bytes
    vocab = data["model"]["vocab"]
    for byte in range(256):
        vocab.setdefault(f"<0x{byte:02X}>", max(vocab.values()) + 1)
    data["model"]["byte_fallback"] = True
    raw = Tokenizer.from_str(json.dumps(data))
    raw.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    return _wrap(raw)


_BUILDERS = {"byte_level": _byte_level, "metaspace": _metaspace, "llama_style": _llama_style}


@pytest.fixture(scope="module")
def tokenizers_by_name() -> dict[str, PreTrainedTokenizerFast]:
    return {name: build() for name, build in _BUILDERS.items()}


@pytest.fixture(scope="module", params=list(_BUILDERS))
def tok(request, tokenizers_by_name) -> PreTrainedTokenizerFast:
    return tokenizers_by_name[request.param]


@pytest.fixture(scope="module")
def byte_tok(tokenizers_by_name) -> PreTrainedTokenizerFast:
    return tokenizers_by_name["byte_level"]


# ---------------------------------------------------------------- helpers


def _encode(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def _chunks(ids: list[int], rng: random.Random, max_size: int) -> list[list[int]]:
    out, i = [], 0
    while i < len(ids):
        size = rng.randint(1, max_size)
        out.append(ids[i : i + size])
        i += size
    return out


def _stream(detok: IncrementalDetokenizer, chunks) -> tuple[list[str], str | None]:
    """Feed chunks until a stop; return the deltas (the last one with finished=True)."""
    deltas, stopped = [], None
    for chunk in chunks:
        stopped = detok.update(chunk)
        if stopped is not None:
            break
        deltas.append(detok.next_delta(finished=False))
    deltas.append(detok.next_delta(finished=True))
    return deltas, stopped


def _in_context(tok, prompt: list[int], output: list[int], skip: bool = True) -> str:
    """Text the output adds to the prompt: decode(prompt + output) minus decode(prompt)."""
    head = tok.decode(prompt, skip_special_tokens=skip)
    full = tok.decode(prompt + output, skip_special_tokens=skip)
    assert full.startswith(head)
    return full[len(head) :]


def _texts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 15))) for _ in range(n)]


class _SlowOnly:
    """A tokenizer with no Rust backend: only ``decode``; counts the ids it decodes."""

    def __init__(self, tok):
        self._tok, self.decoded_ids = tok, 0

    def decode(self, ids, **kwargs):
        self.decoded_ids += len(ids)
        return self._tok.decode(ids, **kwargs)


# ------------------------------------------------------------- decoding


@pytest.mark.parametrize("max_chunk", [1, 5])
def test_deltas_equal_decode_of_output_ids_without_prompt(tok, max_chunk):
    rng = random.Random(max_chunk)
    for text in _texts(60, seed=1):
        ids = _encode(tok, text)
        detok = IncrementalDetokenizer(tok, [])
        deltas, _ = _stream(detok, _chunks(ids, rng, max_chunk))
        assert "".join(deltas) == tok.decode(ids, skip_special_tokens=True) == text
        assert detok.output_text == text


@pytest.mark.parametrize("max_chunk", [1, 5])
def test_deltas_equal_in_context_decode_after_prompt(tok, max_chunk):
    rng = random.Random(max_chunk)
    texts = _texts(120, seed=2)
    for prompt_text, output_text in zip(texts[::2], texts[1::2]):
        prompt, output = _encode(tok, prompt_text), _encode(tok, output_text)
        deltas, _ = _stream(IncrementalDetokenizer(tok, prompt), _chunks(output, rng, max_chunk))
        assert "".join(deltas) == _in_context(tok, prompt, output)


def test_byte_level_deltas_equal_decode_of_output_ids_after_prompt(byte_tok):
    rng = random.Random(3)
    texts = _texts(80, seed=3)
    for prompt_text, output_text in zip(texts[::2], texts[1::2]):
        prompt, output = _encode(byte_tok, prompt_text), _encode(byte_tok, " " + output_text)
        deltas, _ = _stream(IncrementalDetokenizer(byte_tok, prompt), _chunks(output, rng, 3))
        assert "".join(deltas) == byte_tok.decode(output) == " " + output_text


@pytest.mark.parametrize("name", ["metaspace", "llama_style"])
def test_sentencepiece_keeps_leading_space_at_prompt_boundary(tokenizers_by_name, name):
    tok = tokenizers_by_name[name]
    prompt, output = _encode(tok, "hello world"), _encode(tok, "the fox")
    assert tok.convert_ids_to_tokens(output)[0].startswith("▁")
    assert tok.decode(output) == "the fox"  # a lone decode drops the space ...
    detok = IncrementalDetokenizer(tok, prompt)
    for token_id in output:
        detok.update([token_id])
    assert detok.output_text == " the fox"  # ... which belongs between prompt and output
    assert tok.decode(prompt) + detok.output_text == tok.decode(prompt + output)


def test_byte_level_keeps_leading_space_at_prompt_boundary(byte_tok):
    prompt, output = _encode(byte_tok, "hello world"), _encode(byte_tok, " the fox")
    detok = IncrementalDetokenizer(byte_tok, prompt)
    detok.update(output[:1])
    assert detok.next_delta(finished=False).startswith(" ")


@pytest.mark.parametrize("slow", [False, True])
def test_split_multibyte_characters_never_stream_as_replacement_char(tok, slow):
    texts = [t for t in _texts(80, seed=4) if any(ord(c) > 0x2FF for c in t)]
    split_somewhere = False
    for text in texts:
        ids = _encode(tok, text)
        split_somewhere |= any("\ufffd" in tok.decode([i]) for i in ids)
        detok = IncrementalDetokenizer(_SlowOnly(tok) if slow else tok, _encode(tok, "hello"))
        for token_id in ids:
            detok.update([token_id])
            assert "\ufffd" not in detok.next_delta(finished=False)
            assert "\ufffd" not in detok.output_text
    if tok.backend_tokenizer.decoder.__class__.__name__ != "Metaspace":  # char-level alphabet
        assert split_somewhere, "the corpus must split some character across tokens"


def _random_units(tok) -> list[list[int]]:
    """Token ids to build random sequences from. A ByteFallback decoder turns a whole run of
    byte tokens into '\ufffd's once it is invalid UTF-8, so a junk run's text can change as
    bytes arrive; byte tokens therefore only come as whole characters here."""
    vocab = tok.get_vocab()
    units = [[i] for t, i in vocab.items() if not (t.startswith("<0x") and len(t) == 6)]
    return units + [_encode(tok, c) for c in "你好世界🚀🎉"]


@pytest.mark.parametrize("max_chunk", [1, 4])
def test_random_token_ids_stream_up_to_last_complete_character(tok, max_chunk):
    rng = random.Random(5 + max_chunk)
    units = _random_units(tok)
    for trial in range(200):
        prompt = [i for _ in range(rng.randint(0, 8) * (trial % 2)) for i in rng.choice(units)]
        if tok.decode(prompt, skip_special_tokens=True).endswith("\ufffd"):
            continue  # covered by test_prompt_ending_inside_a_character_...
        ids = [i for _ in range(rng.randint(1, 20)) for i in rng.choice(units)]
        chunks = _chunks(ids, rng, max_chunk)
        ends = [sum(map(len, chunks[: k + 1])) for k in range(len(chunks))]
        texts = [_in_context(tok, prompt, ids[:end]) for end in ends]
        complete = [t for t in texts if not t.endswith("\ufffd")]
        deltas, _ = _stream(IncrementalDetokenizer(tok, prompt), chunks)
        assert "".join(deltas) == (complete[-1] if complete else "")


def test_prompt_ending_inside_a_character_emits_the_whole_character(byte_tok):
    ids = _encode(byte_tok, "hello 🚀 fox")
    cut = next(k for k in range(1, len(ids)) if byte_tok.decode(ids[:k]).endswith("\ufffd"))
    prompt, output = ids[:cut], ids[cut:]
    detok = IncrementalDetokenizer(byte_tok, prompt)
    detok.update(output)
    # The prompt's last token (" " plus the rocket's first bytes) had no complete text yet,
    # so its text comes out with the output, whole.
    assert byte_tok.decode(prompt) == "hello \ufffd"
    assert detok.output_text == " 🚀 fox"


@pytest.mark.parametrize("slow", [False, True])
def test_a_cut_character_the_output_does_not_complete_stays_out_of_the_output(byte_tok, slow):
    """Regression (s35's fuzzing of the server): a token-id prompt ending inside a character put that character's
    '\ufffd' (and the rest of its last token's text) at the head of the output text, one character off every
    logprobs text_offset. Bytes the output never completes are the prompt's, not output text."""
    ids = _encode(byte_tok, "hello 🚀")
    cut = next(k for k in range(1, len(ids)) if byte_tok.decode(ids[:k]).endswith("\ufffd"))
    output = _encode(byte_tok, " fox jumps")
    detok = IncrementalDetokenizer(_SlowOnly(byte_tok) if slow else byte_tok, ids[:cut])
    deltas, _ = _stream(detok, [[t] for t in output])
    assert "".join(deltas) == detok.output_text == byte_tok.decode(output) == " fox jumps"


@pytest.mark.parametrize("skip", [True, False])
def test_skip_special_tokens(byte_tok, skip):
    s, eos, user = byte_tok.convert_tokens_to_ids(["<s>", "</s>", "<|user|>"])
    a, b = _encode(byte_tok, "hello 你好"), _encode(byte_tok, " 🚀 fox")
    ids = [s] + a + [user, eos] + b + [eos]
    detok = IncrementalDetokenizer(byte_tok, [s, user], skip_special_tokens=skip)
    deltas, _ = _stream(detok, [[i] for i in ids])
    expected = byte_tok.decode(ids, skip_special_tokens=skip)
    assert "".join(deltas) == expected
    assert ("</s>" in expected) is not skip


def test_fast_path_does_not_call_python_decode(byte_tok, monkeypatch):
    detok = IncrementalDetokenizer(byte_tok, _encode(byte_tok, "hello"))

    def forbidden(*args, **kwargs):
        raise AssertionError("decoded through the transformers wrapper, not DecodeStream")

    monkeypatch.setattr(byte_tok, "decode", forbidden)
    for token_id in _encode(byte_tok, " the quick brown fox 🚀"):
        detok.update([token_id])
    assert detok.output_text == " the quick brown fox 🚀"


@pytest.mark.parametrize("max_chunk", [1, 3])
def test_slow_fallback_matches_fast_path(tok, max_chunk):
    rng = random.Random(6)
    texts = _texts(60, seed=6)
    for prompt_text, output_text in zip(texts[::2], texts[1::2]):
        prompt, output = _encode(tok, prompt_text), _encode(tok, output_text)
        chunks = _chunks(output, rng, max_chunk)
        slow, _ = _stream(IncrementalDetokenizer(_SlowOnly(tok), prompt), chunks)
        fast, _ = _stream(IncrementalDetokenizer(tok, prompt), chunks)
        assert "".join(slow) == "".join(fast) == _in_context(tok, prompt, output)


def test_slow_fallback_is_incremental(byte_tok):
    slow = _SlowOnly(byte_tok)
    output = _encode(byte_tok, " ".join(_texts(60, seed=7)))
    detok = IncrementalDetokenizer(slow, _encode(byte_tok, "hello"))
    for token_id in output:
        detok.update([token_id])
    assert len(output) > 300
    assert slow.decoded_ids < 12 * len(output)  # re-decoding everything would be ~n²/2


def test_decoder_that_rewrites_old_text_does_not_crash():
    raw = Tokenizer(models.WordLevel({"a": 0, "b": 1, "c": 2}, unk_token="a"))
    raw.decoder = decoders.Sequence([decoders.Fuse(), decoders.Replace("ab", "X")])
    detok = IncrementalDetokenizer(raw, [])
    for token_id in [0, 1, 2, 2]:  # "a" is emitted, then "ab" turns into "X"
        detok.update([token_id])
    assert detok.output_text.startswith("a") and detok.output_text.endswith("cc")


# --------------------------------------------------------------- stops


def _run_until_stop(tok, text, stop, include=False, prompt="hello", per_token=True):
    ids = _encode(tok, text)
    detok = IncrementalDetokenizer(
        tok, _encode(tok, prompt), stop=stop, include_stop_str_in_output=include
    )
    deltas, stopped = _stream(detok, [[i] for i in ids] if per_token else [ids])
    assert "".join(deltas) == detok.output_text
    return detok.output_text, stopped


def test_stop_at_start(byte_tok):
    assert _run_until_stop(byte_tok, " fox jumps", [" fox"]) == ("", " fox")


def test_stop_in_middle_is_cut_exactly(byte_tok):
    text, stopped = _run_until_stop(byte_tok, " the quick brown fox jumps", ["brown"])
    assert (text, stopped) == (" the quick ", "brown")


def test_stop_inside_one_token_cuts_mid_token(byte_tok):
    ids = _encode(byte_tok, " the quick")
    assert byte_tok.decode(ids[-1:]).endswith("ck")  # the cut falls inside this token
    assert _run_until_stop(byte_tok, " the quick", ["c"]) == (" the qui", "c")


def test_stop_spanning_several_tokens(byte_tok):
    stop = "quick brown 🚀"
    text = " the quick brown 🚀 fox"
    ids = _encode(byte_tok, text)
    detok = IncrementalDetokenizer(byte_tok, [], stop=[stop])
    updates = 0
    for token_id in ids:
        updates += 1
        if detok.update([token_id]) is not None:
            break
    assert updates < len(ids)
    assert byte_tok.decode(ids[:updates]).endswith(stop)  # stopped on its last token
    assert detok.output_text == " the "


def test_stop_at_very_end(tok):
    text, stopped = _run_until_stop(tok, "the lazy dog", ["dog"])
    assert (text.strip(), stopped) == ("the lazy", "dog")
    assert text.endswith(" ")


def test_include_stop_str_in_output(tok):
    text, stopped = _run_until_stop(tok, "the quick brown fox jumps", ["brown"], include=True)
    assert (text.strip(), stopped) == ("the quick brown", "brown")


def test_earliest_ending_stop_wins_regardless_of_batching(byte_tok):
    for per_token in (True, False):
        text, stopped = _run_until_stop(
            byte_tok, " the quick brown fox", ["quick brown", "ick"], per_token=per_token
        )
        assert (text, stopped) == (" the qu", "ick")


def test_stop_strings_match_reference_for_random_streams(tok):
    rng = random.Random(8)
    for text in _texts(80, seed=8):
        ids = _encode(tok, text)
        prompt = _encode(tok, "hello world")
        full = _in_context(tok, prompt, ids)
        start = rng.randrange(len(full))
        stop = [full[start : start + rng.randint(1, 6)], "zzz"]
        include = rng.random() < 0.5
        detok = IncrementalDetokenizer(
            tok, prompt, stop=stop, include_stop_str_in_output=include
        )
        deltas, stopped = _stream(detok, _chunks(ids, rng, 3))
        ends = {s: full.find(s) + len(s) for s in stop if s in full}
        end = min(ends.values())
        hit = max((s for s in ends if ends[s] == end), key=len)
        assert stopped == hit
        assert detok.output_text == full[: end if include else end - len(hit)]
        assert "".join(deltas) == detok.output_text


def test_text_fed_without_a_stop_check_is_not_searched_later(byte_tok):
    """check_stop=False (the tokens within min_tokens): their text is output and a stop string inside it is no
    stop; one that ends in text fed later is, even where it starts in theirs."""
    detok = IncrementalDetokenizer(byte_tok, [], stop=["fox", "brown fox"])
    assert detok.update(_encode(byte_tok, " the fox"), check_stop=False) is None
    assert detok.update(_encode(byte_tok, " quick brown"), check_stop=False) is None
    assert detok.output_text == " the fox quick brown"
    assert detok.update(_encode(byte_tok, " fox jumps")) == "brown fox"
    assert detok.output_text == " the fox quick "


def test_update_after_stop_is_an_error(byte_tok):
    detok = IncrementalDetokenizer(byte_tok, [], stop=["fox"])
    assert detok.update(_encode(byte_tok, " the fox jumps")) == "fox"
    with pytest.raises(RuntimeError):
        detok.update(_encode(byte_tok, " again"))


def test_empty_stop_string_is_rejected(byte_tok):
    with pytest.raises(ValueError):
        IncrementalDetokenizer(byte_tok, [], stop=["fox", ""])


def test_find_stop_searches_only_the_new_tail():
    text = "stop here, then new"
    assert find_stop(text, 3, ["stop"], False) is None  # old text was already searched
    assert find_stop(text, 3, ["n new"], False) == ("n new", len(text) - 5)
    assert find_stop(text, 3, ["n new"], True) == ("n new", len(text))


# ------------------------------------------------------------ hold-back


def test_hold_back_never_streams_part_of_a_stop_string(tok):
    rng = random.Random(9)
    stop = ["quick brown fox", "🚀 🎉"]
    hold = max(map(len, stop)) - 1
    for text in _texts(80, seed=9) + ["the quick brown fox", "the 🚀 🎉 end"]:
        detok = IncrementalDetokenizer(tok, _encode(tok, "hello"), stop=stop)
        streamed = ""
        for chunk in _chunks(_encode(tok, text), rng, 3):
            if detok.update(chunk) is not None:
                break
            streamed += detok.next_delta(finished=False)
            assert streamed == detok.output_text[: max(0, len(detok.output_text) - hold)]
        final = detok.output_text
        assert final.startswith(streamed)  # nothing streamed was later cut away
        assert streamed + detok.next_delta(finished=True) == final
        assert detok.next_delta(finished=True) == ""


def test_text_cut_at_a_stop_is_final_and_not_held_back(byte_tok):
    detok = IncrementalDetokenizer(byte_tok, [], stop=["fox", "a long stop string"])
    assert detok.update(_encode(byte_tok, " the quick fox jumps")) == "fox"
    assert detok.next_delta(finished=False) == " the quick "
    assert detok.stopped_on == "fox"


def test_no_hold_back_without_stop_strings(byte_tok):
    detok = IncrementalDetokenizer(byte_tok, [])
    detok.update(_encode(byte_tok, " the fox"))
    assert detok.next_delta(finished=False) == " the fox"
