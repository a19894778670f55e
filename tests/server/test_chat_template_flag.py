"""--chat-template (EngineConfig.chat_template, vLLM's flag): a model folder without a chat template serves chat
through one given at start-up, from a file or as text; one that cannot render is refused at load, named."""

import shutil

import openai
import pytest

from graphllm.config import EngineConfig
from graphllm.runtime.engine import Engine
from tests.server.conftest import start

TEMPLATE = "{% for m in messages %}[{{ m.role }}] {{ m.content }} {% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"


@pytest.fixture(scope="module")
def bare_model(tiny_model_dir, tmp_path_factory) -> str:
    """The tiny Llama's folder without any chat template (another test module may have written one into it)."""
    path, _ = tiny_model_dir("llama")
    bare = tmp_path_factory.mktemp("bare") / "llama"
    shutil.copytree(path, bare)
    (bare / "chat_template.jinja").unlink(missing_ok=True)
    return str(bare)


def test_a_template_file_serves_chat_for_a_model_without_one(request, bare_model, tmp_path):
    plain = Engine(EngineConfig(model=bare_model))
    with pytest.raises(ValueError, match="no chat template"):
        plain.apply_chat_template([{"role": "user", "content": "w3"}])
    template = tmp_path / "template.jinja"
    template.write_text(TEMPLATE)
    engine = Engine(EngineConfig(model=bare_model, chat_template=str(template)))
    rendered = "[user] w3 w4 [assistant]"
    expected = engine.tokenizer(rendered, add_special_tokens=False)["input_ids"]
    assert engine.apply_chat_template([{"role": "user", "content": "w3 w4"}]) == expected
    running = start(request, engine)
    reply = running.client().chat.completions.create(model="demo", messages=[{"role": "user", "content": "w3 w4"}],
                                                     max_tokens=2, temperature=0)
    assert reply.usage.prompt_tokens == len(expected)
    bare_server = start(request, plain)
    with pytest.raises(openai.BadRequestError, match="no chat template"):
        bare_server.client().chat.completions.create(model="demo", messages=[{"role": "user", "content": "w3"}],
                                                     max_tokens=2)


def test_template_text_replaces_the_tokenizers_own(bare_model):
    engine = Engine(EngineConfig(model=bare_model, chat_template="{{ messages[0].content }} w9"))
    assert engine.apply_chat_template([{"role": "user", "content": "w3"}]) == \
        engine.tokenizer("w3 w9", add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("value, message", [
    ("{% for m in messages %}{{ m.content }}", r"--chat-template does not render a one-message conversation: "
                                               r"TemplateSyntaxError"),
    ("{{ raise_exception('system message required') }}", "system message required"),
    ("no/such/template.jinja", "neither a file nor a Jinja template"),
])
def test_a_template_that_cannot_render_is_refused_at_load(bare_model, value, message):
    with pytest.raises(ValueError, match=message):
        Engine(EngineConfig(model=bare_model, chat_template=value))
