"""POST /v1/completions through the official openai client."""

import openai
import pytest

from tests.server.conftest import MODEL

PROMPT = "<|user|>What is 23 plus 45?<|end|><|assistant|>"
TOKEN_PROMPT = [5, 6, 7, 8]  # odd input: the model is unsure, so sampling spreads


def test_completion_greedy_and_streamed_agree(client):
    whole = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0)
    [choice] = whole.choices
    assert choice.text and choice.finish_reason in ("stop", "length")
    assert whole.usage.prompt_tokens > 0
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens
    stream = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, stream=True)
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks) == choice.text
    assert chunks[-1].choices[0].finish_reason == choice.finish_reason
    assert all(c.usage is None for c in chunks)  # no include_usage: no usage chunk


def test_prompt_list_and_token_ids_give_one_choice_per_prompt_and_n(client):
    out = client.completions.create(model=MODEL, prompt=[TOKEN_PROMPT, [9, 10, 11]], n=2, max_tokens=4,
                                    temperature=1.0, seed=3)
    assert sorted(c.index for c in out.choices) == [0, 1, 2, 3]
    assert out.usage.prompt_tokens == 7
    assert 2 <= out.usage.completion_tokens <= 16
    texts = client.completions.create(model=MODEL, prompt=[PROMPT, PROMPT], max_tokens=4, temperature=0)
    assert [c.index for c in texts.choices] == [0, 1] and texts.choices[0].text == texts.choices[1].text


def test_echo_prepends_the_prompt(client):
    out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0, echo=True)
    plain = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0)
    assert out.choices[0].text == PROMPT + plain.choices[0].text
    streamed = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0, echo=True,
                                         stream=True)
    assert "".join(c.choices[0].text for c in streamed) == out.choices[0].text


def test_stop_cuts_exactly(client):
    full = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0).choices[0].text
    assert len(full) >= 6, full
    cut = len(full) // 2
    stop = full[cut:cut + 2]
    cut = full.find(stop)  # the first occurrence is where generation must stop
    for stream in (False, True):
        out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0, stop=[stop],
                                        stream=stream)
        chunks = list(out) if stream else [out]
        assert "".join(c.choices[0].text for c in chunks) == full[:cut]
        assert chunks[-1].choices[0].finish_reason == "stop"


def test_logprobs_are_consistent(client, pieces_join):
    out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, logprobs=2)
    choice = out.choices[0]
    lp = choice.logprobs
    assert "".join(lp.tokens) == choice.text or not pieces_join
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) > 0
    offset = 0
    for token, value, top, start in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, lp.text_offset):
        assert start == offset
        offset += len(token)
        assert value <= 0 and top[token] == value  # greedy: the sampled token is in its own top list
        assert 2 <= len(top) <= 3 and max(top.values()) == value
    # a stop string that never comes makes the stream hold text back: offsets must not follow the text
    streamed = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, logprobs=2,
                                         stream=True, stop=["@@@@"])
    parts = [c.choices[0].logprobs for c in streamed if c.choices[0].logprobs]
    assert [t for p in parts for t in p.tokens] == lp.tokens
    assert [o for p in parts for o in p.text_offset] == lp.text_offset


def test_seed_makes_sampling_reproducible(client):
    def sample(seed):
        return client.completions.create(model=MODEL, prompt=TOKEN_PROMPT, max_tokens=16, temperature=1.0,
                                         seed=seed, extra_body={"ignore_eos": True}).choices[0].text
    first = sample(1)
    assert sample(1) == first
    assert any(sample(seed) != first for seed in (2, 3, 4))


def test_vllm_extra_sampling_fields_are_applied(client):
    out = client.completions.create(model=MODEL, prompt=TOKEN_PROMPT, max_tokens=6, temperature=0,
                                    extra_body={"min_tokens": 6, "ignore_eos": True, "top_k": 5, "min_p": 0.1,
                                                "repetition_penalty": 1.2})
    assert out.usage.completion_tokens == 6 and out.choices[0].finish_reason == "length"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt=TOKEN_PROMPT, extra_body={"top_k": -5})
    assert e.value.status_code == 400 and e.value.body["param"] == "top_k"


def test_logit_bias_forces_and_bans_tokens(server, client):
    """OpenAI's logit_bias (token ids as string keys): +100 on a token makes greedy decoding repeat it; -100 on the
    greedy first token moves the first token elsewhere; an engine outside the server refuses a key past the
    vocabulary too."""
    greedy = client.completions.create(model=MODEL, prompt="1 + 1 =", max_tokens=4, temperature=0, logprobs=0)
    forced_id = server.engine.tokenizer.encode("7", add_special_tokens=False)[-1]
    forced = client.completions.create(model=MODEL, prompt="1 + 1 =", max_tokens=4, temperature=0, logprobs=0,
                                       logit_bias={str(forced_id): 100})
    piece = forced.choices[0].logprobs.tokens[0]
    assert forced.choices[0].logprobs.tokens == [piece] * 4 and piece != greedy.choices[0].logprobs.tokens[0]
    from graphllm import SamplingParams
    [out] = server.engine.generate(["1 + 1 ="], SamplingParams(temperature=0, max_tokens=1))
    first_id = out.outputs[0].token_ids[0]
    banned = client.completions.create(model=MODEL, prompt="1 + 1 =", max_tokens=1, temperature=0,
                                       logprobs=0, logit_bias={str(first_id): -100})
    assert banned.choices[0].logprobs.tokens[0] != greedy.choices[0].logprobs.tokens[0]
    with pytest.raises(ValueError, match="logit_bias keys must lie in"):
        server.engine.add_request([1, 2], SamplingParams(logit_bias={10**7: 1.0}))
