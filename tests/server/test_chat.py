"""POST /v1/chat/completions through the official openai client."""

from tests.server.conftest import MODEL

MESSAGES = [{"role": "system", "content": "You are a calculator."},
            {"role": "user", "content": "What is 23 plus 45?"}]


def test_chat_greedy_and_streamed_agree(client):
    whole = client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=24)
    [choice] = whole.choices
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length") and not choice.message.tool_calls
    assert whole.object == "chat.completion" and whole.model == MODEL
    chunks = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=24,
                                                 stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == choice.message.content
    assert [c.choices[0].finish_reason for c in chunks].count(choice.finish_reason) == 1
    assert chunks[-1].choices[0].finish_reason == choice.finish_reason
    assert len({c.id for c in chunks}) == 1 and all(c.usage is None for c in chunks)


def test_include_usage_yields_a_final_usage_chunk(client, engine):
    whole = client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=24)
    chunks = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=24,
                                                 stream=True, stream_options={"include_usage": True}))
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.prompt_tokens == whole.usage.prompt_tokens == len(engine.apply_chat_template(MESSAGES))
    assert last.usage.completion_tokens == whole.usage.completion_tokens > 0
    assert last.usage.total_tokens == last.usage.prompt_tokens + last.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_n_gives_n_choices(client):
    out = client.chat.completions.create(model=MODEL, messages=MESSAGES, n=2, temperature=1.0, seed=5,
                                         max_tokens=8)
    assert [c.index for c in out.choices] == [0, 1]
    assert all(c.message.content is not None for c in out.choices)
    chunks = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, n=2, temperature=1.0, seed=5,
                                                 max_tokens=8, stream=True))
    for index, choice in enumerate(out.choices):  # same seed: the streamed choices match
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices[0].index == index)
        assert text == choice.message.content


def test_stop_cuts_exactly(client):
    full = client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0,
                                          max_tokens=24).choices[0].message.content
    assert len(full) >= 6, full
    stop = full[len(full) // 2:len(full) // 2 + 2]
    out = client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=24, stop=stop)
    assert out.choices[0].message.content == full[:full.find(stop)]
    assert out.choices[0].finish_reason == "stop"


def test_logprobs_and_top_logprobs_are_consistent(client, pieces_join):
    out = client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=24,
                                         logprobs=True, top_logprobs=3)
    choice = out.choices[0]
    content = choice.logprobs.content
    assert "".join(t.token for t in content) == choice.message.content or not pieces_join
    ended_by_eos = choice.finish_reason == "stop"
    assert len(content) == out.usage.completion_tokens - ended_by_eos  # EOS makes no text, has no entry
    for t in content:
        assert len(t.top_logprobs) == 3
        values = [top.logprob for top in t.top_logprobs]
        assert values == sorted(values, reverse=True) and all(v <= 0 for v in values)
        assert (t.top_logprobs[0].token, t.top_logprobs[0].logprob) == (t.token, t.logprob)  # greedy
        assert t.bytes == list(t.token.encode())
    chunks = client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=24,
                                            logprobs=True, top_logprobs=3, stream=True)
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert [(t.token, t.logprob) for t in streamed] == [(t.token, t.logprob) for t in content]
    plain = client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=4)
    assert plain.choices[0].logprobs is None


def test_seed_makes_sampling_reproducible(client):
    def sample(seed):
        return client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "%%%"}], temperature=1.5, seed=seed,
            max_tokens=12, extra_body={"ignore_eos": True}).choices[0].message.content
    first = sample(11)
    assert sample(11) == first
    assert any(sample(seed) != first for seed in (12, 13, 14))


def test_max_completion_tokens_and_penalties(client):
    out = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_completion_tokens=3,
                                         presence_penalty=0.5, frequency_penalty=0.5, temperature=0,
                                         extra_body={"ignore_eos": True})
    assert out.usage.completion_tokens == 3 and out.choices[0].finish_reason == "length"


def test_roles_and_content_parts(client):
    messages = [{"role": "developer", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "What is 7 times 8?"}]},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "multiply", "arguments": '{"a": 7, "b": 8}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "56"}]
    out = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, temperature=0)
    assert out.usage.prompt_tokens > 10 and out.choices[0].message.content is not None
