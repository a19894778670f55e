"""Tests for graphllm.server.reasoning_parsers: whole-text splits, and streaming the same texts
in arbitrary chunks (every split point, seeded random chunkings, one character at a time)."""

import random

import pytest

from graphllm.server.reasoning_parsers import (
    REASONING_PARSERS, DeepSeekR1ReasoningParser, Qwen3ReasoningParser,
)

# (text, expected reasoning, expected content)
DEEPSEEK_CASES = {
    "template_opened": ("Multiply 6 by 7.\n</think>\n\nThe answer is 42.", "Multiply 6 by 7.", "The answer is 42."),
    "explicit_open": ("<think>\nhmm, 6*7\n</think>42", "hmm, 6*7", "42"),
    "spaces_then_open": ("  \n<think>x < y</think> ok ", "x < y", "ok "),
    "no_close_all_reasoning": ("still thinking about </thin", "still thinking about </thin", None),
    "empty_reasoning": ("</think>\n\nJust the answer.", None, "Just the answer."),
    "empty_content": ("<think>only thoughts</think>\n\n", "only thoughts", None),
    "later_tags_stay": ("a</think>b <think>c</think>d", "a", "b <think>c</think>d"),
    "open_not_at_start": ("x<think>y</think>z", "x<think>y", "z"),
    "partial_open_only": ("<thi", "<thi", None),
    "empty": ("", None, None),
}

QWEN_CASES = {
    "think_block": ("<think>\nLet me see: 6*7=42.\n</think>\n\nThe answer is 42.",
                    "Let me see: 6*7=42.", "The answer is 42."),
    "no_tags_all_content": ("  The answer is 42.\n", None, "  The answer is 42.\n"),
    "content_before": ("Sure. <think>why</think>  Done", "why", "Sure. Done"),
    "unclosed": ("<think>truncated reason", "truncated reason", None),
    "empty_think": ("<think>\n\n</think>\n\nHello", None, "Hello"),
    "close_without_open": ("text </think> more", None, "text </think> more"),
    "second_block_is_content": ("<think>a</think>b<think>c</think>", "a", "b<think>c</think>"),
    "partial_tags": ("x <thin y </thi", None, "x <thin y </thi"),
    "empty": ("", None, None),
}

CASES = [(DeepSeekR1ReasoningParser, name, *case) for name, case in DEEPSEEK_CASES.items()] + \
        [(Qwen3ReasoningParser, name, *case) for name, case in QWEN_CASES.items()]
CASE_IDS = [f"{parser.name}-{name}" for parser, name, *_ in CASES]


def _stream(parser, chunks: list[str]) -> tuple[str | None, str | None]:
    stream, reasoning, content = parser.stream(), "", ""
    for r, c in [stream.feed(chunk) for chunk in chunks] + [stream.finish()]:
        reasoning, content = reasoning + r, content + c
    return reasoning or None, content or None


def _chunkings(text: str):
    """Every split into two, one character at a time, and seeded random chunkings."""
    yield [text]
    for i in range(1, len(text)):
        yield [text[:i], text[i:]]
    yield list(text)
    rng = random.Random(0)
    for _ in range(20):
        k = min(len(text) - 1, rng.randint(1, 8))
        cuts = sorted(rng.sample(range(1, len(text)), k)) if k > 0 else []
        yield [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]


def test_registry():
    assert REASONING_PARSERS == {"deepseek_r1": DeepSeekR1ReasoningParser, "qwen3": Qwen3ReasoningParser}
    assert all(cls.name == key for key, cls in REASONING_PARSERS.items())


@pytest.mark.parametrize("parser_cls,name,text,reasoning,content", CASES, ids=CASE_IDS)
def test_extract(parser_cls, name, text, reasoning, content):
    assert parser_cls().extract(text) == (reasoning, content)


@pytest.mark.parametrize("parser_cls,name,text,reasoning,content", CASES, ids=CASE_IDS)
def test_stream_matches_extract_for_every_chunking(parser_cls, name, text, reasoning, content):
    parser = parser_cls()
    expected = parser.extract(text)
    for chunks in _chunkings(text):
        assert _stream(parser, chunks) == expected, chunks


@pytest.mark.parametrize("parser_cls,name,text,reasoning,content", CASES, ids=CASE_IDS)
def test_stream_is_never_retracted(parser_cls, name, text, reasoning, content):
    """One character at a time, what was sent of each kind is always a prefix of the final
    value: no partial tag ever reaches the client."""
    stream, sent_r, sent_c = parser_cls().stream(), "", ""
    for char in text:
        r, c = stream.feed(char)
        sent_r, sent_c = sent_r + r, sent_c + c
        assert (reasoning or "").startswith(sent_r) and (content or "").startswith(sent_c), (sent_r, sent_c)


def test_deepseek_streams_reasoning_then_content():
    stream = DeepSeekR1ReasoningParser().stream()
    assert stream.feed("<thi") == ("", "")
    assert stream.feed("nk>\nstep one") == ("step one", "")
    assert stream.feed(" </thi") == ("", "")
    assert stream.feed("nk>\n\nAns") == ("", "Ans")
    assert stream.feed("wer") == ("", "wer")
    assert stream.finish() == ("", "")


def test_qwen3_plain_content_streams_without_waiting():
    stream = Qwen3ReasoningParser().stream()
    assert stream.feed("Hello ") == ("", "Hello ")
    assert stream.feed("<th") == ("", "")
    assert stream.feed("ink>why") == ("why", "")
    assert stream.finish() == ("", "")


def test_where_the_answer_starts_for_a_grammar():
    from graphllm.server.reasoning_parsers import REASONING_PARSERS
    qwen3, r1 = REASONING_PARSERS["qwen3"](), REASONING_PARSERS["deepseek_r1"]()
    assert qwen3.answer_starts_in_reasoning("<|im_start|>assistant\n<think>\n")
    assert not qwen3.answer_starts_in_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not qwen3.answer_starts_in_reasoning("<|im_start|>assistant\n")
    assert r1.answer_starts_in_reasoning("<｜Assistant｜>")
