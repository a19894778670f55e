"""Sampling defaults (vLLM's --generation-config, --override-generation-config) and --max-logprobs, on a real
server with the openai client. A tiny model whose generation_config.json sets top_k 1 samples greedily whenever
a request leaves top_k out; "vllm" drops that default; an override wins over both."""

import json
import shutil

import openai
import pytest

from graphllm.config import EngineConfig
from graphllm.runtime.engine import Engine
from graphllm.server.config import ServerConfig
from tests.server.conftest import start

PROMPT = "w3 w4 w5 w6"


@pytest.fixture(scope="module")
def top1_engine(tiny_model_dir, tmp_path_factory):
    """The tiny Llama with top_k 1 (greedy) in its generation_config.json."""
    path, _ = tiny_model_dir("llama")
    folder = tmp_path_factory.mktemp("gen") / "llama"
    shutil.copytree(path, folder)
    gen = folder / "generation_config.json"
    gen.write_text(json.dumps({**json.loads(gen.read_text()), "top_k": 1, "temperature": 1.0}))
    return Engine(EngineConfig(model=str(folder)))


def tokens(client, extra_body: dict | None = None, **kwargs) -> list[str]:
    reply = client.completions.create(model="demo", prompt=PROMPT, max_tokens=12, seed=7, logprobs=0,
                                      extra_body={"ignore_eos": True, **(extra_body or {})}, **kwargs)
    return reply.choices[0].logprobs.tokens


def test_the_models_defaults_apply_and_vllm_drops_them(request, top1_engine):
    model_defaults = start(request, top1_engine).client()
    greedy = tokens(model_defaults, temperature=0)
    assert tokens(model_defaults) == greedy  # top_k 1 from generation_config.json
    assert tokens(model_defaults, extra_body={"top_k": 0}) != greedy  # a request's own value wins
    no_defaults = start(request, top1_engine, generation_config="vllm").client()
    assert tokens(no_defaults) != greedy
    overridden = start(request, top1_engine, override_generation_config={"top_k": 0}).client()
    assert tokens(overridden) != greedy


def test_another_folders_generation_config(request, top1_engine, tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.0}))
    client = start(request, top1_engine, generation_config=str(tmp_path), override_generation_config=None).client()
    assert tokens(client, extra_body={"top_k": 0}) == tokens(client, temperature=0)  # its temperature 0 applies


def test_bad_generation_config_options_are_refused_at_start(tmp_path):
    with pytest.raises(ValueError, match="holds none"):
        ServerConfig(served_model_names=("m",), generation_config=str(tmp_path))
    (tmp_path / "generation_config.json").write_text('{"temperature": 0.5')  # damaged: named before start-up
    with pytest.raises(ValueError, match="generation_config.json is not a JSON file"):
        ServerConfig(served_model_names=("m",), generation_config=str(tmp_path))
    (tmp_path / "generation_config.json").write_text("[0.5]")
    with pytest.raises(ValueError, match="holds list, not a JSON object"):
        ServerConfig(served_model_names=("m",), generation_config=str(tmp_path))
    with pytest.raises(ValueError, match="not max_tokens"):
        ServerConfig(served_model_names=("m",), override_generation_config={"max_tokens": 5})
    with pytest.raises(ValueError, match="max_logprobs must be >= 1"):
        ServerConfig(served_model_names=("m",), max_logprobs=0)


def test_max_logprobs_bounds_what_a_request_may_ask(request, top1_engine):
    client = start(request, top1_engine, max_logprobs=3).client()
    assert len(client.completions.create(model="demo", prompt=PROMPT, max_tokens=2, logprobs=3)
               .choices[0].logprobs.top_logprobs[0]) == 3
    with pytest.raises(openai.BadRequestError, match=r"logprobs must be in \[0, 3\], got 4"):
        client.completions.create(model="demo", prompt=PROMPT, max_tokens=2, logprobs=4)
