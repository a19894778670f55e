"""render_prompt: messages through the chat template of the tokenizer the server got from EngineClient."""

import pytest

from graphllm.server.serving_chat import render_prompt
from graphllm.server.errors import OpenAIError
from graphllm.server.protocol import ChatMessage

MESSAGES = [ChatMessage(role="user", content="What is 7 times 8?")]


class NoTemplate:
    chat_template = None


@pytest.mark.parametrize("tokenizer", [None, NoTemplate()], ids=["no tokenizer", "no chat template"])
def test_a_model_without_a_chat_template_is_a_400(tokenizer):
    with pytest.raises(OpenAIError) as info:
        render_prompt(tokenizer, MESSAGES)
    assert info.value.status == 400 and info.value.param == "messages"
    assert info.value.message == "the chat template failed on these messages: this model has no chat template"


def test_renders_like_the_engine(engine):
    tools = [{"type": "function", "function": {"name": "multiply", "parameters": {"type": "object"}}}]
    assert render_prompt(engine.tokenizer, MESSAGES) == engine.apply_chat_template(
        [{"role": "user", "content": "What is 7 times 8?"}])
    assert render_prompt(engine.tokenizer, MESSAGES, tools) == engine.apply_chat_template(
        [{"role": "user", "content": "What is 7 times 8?"}], tools=tools)
