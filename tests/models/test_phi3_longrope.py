"""Phi-3 LongRoPE (models/config.py longrope_rope and fit_max_model_len, models/layers.py RotaryEmbedding).

cos and sin equal transformers' Phi3RotaryEmbedding for either factor set; greedy tokens equal transformers'
generate, eager and compiled (an artifact loaded with Engine.load), on both sides of the tiny config's
original_max_position_embeddings (32, tests/tiny_models.EXTRA_CONFIGS):
- short: an engine of max_model_len 32 runs the short factors, as transformers does for sequences within 32
  positions; the artifact compiled for it keeps them, and so serves no more than 32 positions;
- long: the default max_model_len (256) runs the long factors, as transformers does for a prompt already past 32.
Malformed longrope configs are refused by name.
"""

import copy

import pytest
import torch
import transformers

from graphllm import Engine, EngineConfig, SamplingParams
from graphllm.models.layers import RotaryEmbedding
from graphllm.models.registry import resolve_architecture
from tests.conftest import compile_cached
from tests.tiny_models import COMMON, EXTRA_CONFIGS

ARCH = "phi3-longrope"
ORIGINAL_MAX = 32
# short: prompt + output within 32 tokens (the last step's largest position is 30)
SHORT_PROMPTS = [[1, 5, 9, 17, 33, 65, 100], [1, 42], [1, 7, 7, 7, 90, 3, 4, 5, 6, 120, 11]]
SHORT_NEW_TOKENS = 20
# long: every prompt past 32 tokens, so transformers' prefill already takes the long factors
LONG_PROMPTS = [[1] + list(range(10, 50)), [1] + [(7 * i) % 120 + 3 for i in range(35)]]
LONG_NEW_TOKENS = 24


def transformers_tokens(hf, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    outs = []
    for prompt in prompts:
        with torch.no_grad():
            out = hf.generate(torch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=False,
                              eos_token_id=None, pad_token_id=0)
        outs.append(out[0, len(prompt):].tolist())
    return outs


def engine_tokens(engine: Engine, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    return [o.outputs[0].token_ids for o in engine.generate(prompts, params)]


@pytest.fixture(scope="module")
def short_artifact(tiny_model_dir):
    """The artifact of an engine of max_model_len 32: compiled with the short factors."""
    path, _ = tiny_model_dir(ARCH)
    return compile_cached(EngineConfig(model=str(path), dtype="float32", max_model_len=ORIGINAL_MAX), path)


@pytest.mark.parametrize("kind", ["eager", "compiled"])
def test_short_factors_within_the_original_context(kind, tiny_model_dir, short_artifact):
    path, hf = tiny_model_dir(ARCH)
    if kind == "eager":
        engine = Engine.from_pretrained(path, max_model_len=ORIGINAL_MAX, dtype="float32")
    else:
        engine = Engine.load(short_artifact)  # no max_model_len asked: the artifact's 32 positions
    assert engine.state.max_model_len == ORIGINAL_MAX
    assert not engine.state.model_config.rope.use_long_factor
    assert engine_tokens(engine, SHORT_PROMPTS, SHORT_NEW_TOKENS) == transformers_tokens(hf, SHORT_PROMPTS,
                                                                                         SHORT_NEW_TOKENS)


@pytest.mark.parametrize("kind", ["eager", "compiled"])
def test_long_factors_past_the_original_context(kind, tiny_model_dir, compiled_dir):
    path, hf = tiny_model_dir(ARCH)
    engine = Engine.from_pretrained(path, dtype="float32") if kind == "eager" else Engine.load(compiled_dir(ARCH))
    assert engine.state.max_model_len == COMMON["max_position_embeddings"] > ORIGINAL_MAX
    assert engine.state.model_config.rope.use_long_factor
    assert engine_tokens(engine, LONG_PROMPTS, LONG_NEW_TOKENS) == transformers_tokens(hf, LONG_PROMPTS,
                                                                                       LONG_NEW_TOKENS)


def test_the_factor_choice_changes_the_tokens(tiny_model_dir):
    """The parity tests can fail: the long factors on the short prompts give other tokens than transformers'."""
    path, hf = tiny_model_dir(ARCH)
    engine = Engine.from_pretrained(path, dtype="float32")  # max_model_len 256: the long factors
    assert engine_tokens(engine, SHORT_PROMPTS, SHORT_NEW_TOKENS) != transformers_tokens(hf, SHORT_PROMPTS,
                                                                                         SHORT_NEW_TOKENS)


def test_short_artifact_refuses_a_longer_max_model_len(short_artifact):
    with pytest.raises(ValueError, match="max_model_len=64 needs LongRoPE's long factors.*recompile"):
        Engine.load(short_artifact, max_model_len=64)


def phi3_config(**rope_scaling) -> dict:
    """A tiny Phi-3 config.json as published (rope_scaling and the top-level original length)."""
    _, extra = EXTRA_CONFIGS[ARCH]
    return {**COMMON, **extra, "architectures": ["Phi3ForCausalLM"],
            "rope_scaling": {**extra["rope_scaling"], **rope_scaling}}


ROPE_VARIANTS = {
    "derived": dict(),  # attention factor from max_position_embeddings / original_max_position_embeddings
    "su": dict(type="su", original_max_position_embeddings=ORIGINAL_MAX),  # the first 128k configs' name
    "factor": dict(factor=3.0),  # transformers 5: an explicit factor replaces the ratio of the two lengths
    "attention_factor": dict(attention_factor=1.7),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("variant", ROPE_VARIANTS)
@pytest.mark.parametrize("positions", [ORIGINAL_MAX, ORIGINAL_MAX + 9], ids=["short", "long"])
def test_cos_sin_equal_transformers(positions, variant, dtype):
    raw = phi3_config(**ROPE_VARIANTS[variant])
    hf_config = transformers.Phi3Config(**copy.deepcopy({k: v for k, v in raw.items() if k != "architectures"}))
    theirs = transformers.models.phi3.modeling_phi3.Phi3RotaryEmbedding(hf_config)
    pos = torch.arange(positions)
    want_cos, want_sin = theirs(torch.zeros(1, dtype=dtype), pos[None])  # picks long past 32 positions
    _, config = resolve_architecture(raw, max_model_len=positions)  # the engine's static choice for this length
    assert config.rope.use_long_factor == (positions > ORIGINAL_MAX)
    cos, sin = RotaryEmbedding(config.rope, config.head_dim)(pos, dtype)
    assert torch.equal(cos, want_cos[0]) and torch.equal(sin, want_sin[0])


@pytest.mark.parametrize("rope_scaling, words", [
    (dict(short_factor=[1.0] * 7), "short_factor must be a list of 8 numbers"),
    (dict(long_factor=None), "long_factor must be a list of 8 numbers"),
    (dict(long_factor=[1.0] * 7 + ["2"]), "long_factor must be a list of 8 numbers"),
    (dict(beta_fast=32), "longrope rope_scaling sets beta_fast"),
    (dict(partial_rotary_factor=0.5), "partial_rotary_factor=0.5"),
    (dict(type="yarn", factor=4.0, original_max_position_embeddings=ORIGINAL_MAX), "rope type 'yarn'"),
])
def test_malformed_longrope_is_refused_by_name(rope_scaling, words):
    with pytest.raises(ValueError, match=words):
        resolve_architecture(phi3_config(**rope_scaling))


def test_original_length_only_inside_rope_scaling_is_refused():
    """transformers' Phi-3 would read its default 4096 over rope_scaling's own value: ambiguous, refused."""
    raw = phi3_config(original_max_position_embeddings=ORIGINAL_MAX)
    del raw["original_max_position_embeddings"]
    with pytest.raises(ValueError, match="original_max_position_embeddings=32 without the top-level field"):
        resolve_architecture(raw)
