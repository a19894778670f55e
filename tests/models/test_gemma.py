"""Gemma 2 / Gemma 3 (models/gemma.py, models/gemma_config.py): logits equal transformers' (the final soft cap and
the tanh GELU, which greedy tokens cannot see), the published configs read as transformers reads them, and what
graphllm's Gemma does not do is refused by name. Greedy tokens, eager and compiled: tests/test_parity.py."""

import json

import pytest
import torch
import torch.nn.functional as F
import transformers

from graphllm.backends import TorchBackend
from graphllm.bench.presets import PRESETS
from graphllm.models import load_model
from graphllm.models.gemma import GemmaRMSNorm, embedding_normalizers
from graphllm.models.registry import resolve_architecture
from graphllm.ops.attention import AttentionMetadata, use_backend
from graphllm.passes.parallel.shard_tp import ShardTP

PROMPT = [1] + list(range(10, 40))  # 31 tokens: past both tiny windows (8, 6)
BLOCK_SIZE = 16


def paged_logits(model, config, ids: list[int], chunk: int) -> torch.Tensor:
    """Logits [T, vocab] of every position, the prompt prefilled in chunks of `chunk` over a paged cache."""
    blocks = -(-len(ids) // BLOCK_SIZE)
    tables = torch.arange(blocks)[None].flip(1)  # [1, M]: pages out of order
    caches = [torch.zeros(2, blocks, BLOCK_SIZE, config.num_key_value_heads, config.head_dim)
              for _ in range(config.num_hidden_layers)]
    out = []
    for start in range(0, len(ids), chunk):
        pos = torch.arange(start, min(start + chunk, len(ids)))
        slots = tables[0, pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE
        meta = AttentionMetadata(slots, tables, torch.tensor([int(pos[-1]) + 1]), torch.tensor([0, len(pos)]), caches)
        with torch.no_grad(), use_backend(TorchBackend()):
            out.append(model.compute_logits(model(torch.tensor(ids)[pos], pos, meta)))
    return torch.cat(out)


@pytest.mark.parametrize("arch", ["gemma2", "gemma3"])
def test_logits_match_transformers(arch, tiny_model_dir):
    folder, hf = tiny_model_dir(arch)
    model, config = load_model(folder)
    with torch.no_grad():
        expected = hf(torch.tensor([PROMPT])).logits[0]  # [T, vocab]
    for chunk in (len(PROMPT), 5):  # one prefill; chunks that cross the window and the pages
        torch.testing.assert_close(paged_logits(model, config, PROMPT, chunk), expected, atol=1e-5, rtol=1e-5)
    if arch == "gemma2":  # the final cap bends these logits: |logits| reach past half the cap
        assert config.final_logit_softcapping == 5.0 and expected.abs().max() > 2.5


def test_norm_is_gemmas_bit_for_bit_in_bfloat16():
    from transformers.models.gemma2.modeling_gemma2 import Gemma2RMSNorm
    theirs, ours = Gemma2RMSNorm(64, eps=1e-6), GemmaRMSNorm(64, 1e-6)
    with torch.no_grad():
        theirs.weight.normal_(0, 0.5)
        ours.weight.copy_(theirs.weight)
    x = torch.randn(5, 64).to(torch.bfloat16)
    assert torch.equal(ours.to(torch.bfloat16)(x), theirs.to(torch.bfloat16)(x))


def test_embedding_scale_is_rounded_to_the_dtype_as_transformers_does():
    from transformers.models.gemma2.modeling_gemma2 import Gemma2TextScaledWordEmbedding
    hidden = 3584  # gemma-2-9b: sqrt is 59.87, 59.75 in bfloat16
    embedding = Gemma2TextScaledWordEmbedding(16, hidden, 0, embed_scale=hidden ** 0.5).to(torch.bfloat16)
    ids = torch.arange(16)
    with torch.no_grad():
        expected = embedding(ids)
        plain = F.embedding(ids, embedding.weight)
    assert torch.equal(plain * embedding_normalizers(hidden)[torch.bfloat16], expected)
    assert not torch.equal(plain * hidden ** 0.5, expected)  # unrounded: other values


def test_published_configs():
    _, g2 = resolve_architecture(PRESETS["gemma-2-9b"])
    assert [g2.window_of(i) for i in range(4)] == [4096, 0, 4096, 0]  # no layer_types: even layers slide
    assert (g2.attention_scale, g2.attn_logit_softcapping, g2.final_logit_softcapping) == (256 ** -0.5, 50.0, 30.0)
    assert g2.tie_word_embeddings and not g2.qk_norm and g2.rope_local is None
    _, g3 = resolve_architecture(PRESETS["gemma-3-12b"])
    assert [g3.window_of(i) for i in range(12)] == ([1024] * 5 + [0]) * 2  # sliding_window_pattern 6
    assert (g3.rope.rope_type, g3.rope.factor, g3.rope.theta) == ("linear", 8.0, 1e6)
    assert (g3.rope_local.rope_type, g3.rope_local.theta) == ("default", 1e4)
    assert g3.qk_norm and (g3.attn_logit_softcapping, g3.final_logit_softcapping) == (0.0, 0.0)


@pytest.mark.parametrize("name", ["gemma-2-9b", "gemma-3-1b", "gemma-3-12b"])
def test_transformers_5_configs_read_like_the_published_ones(name, tmp_path):
    """transformers 5 saves layer_types and rope_parameters (per layer type for Gemma 3) where the published
    config.json has sliding_window_pattern, rope_theta, rope_scaling and rope_local_base_freq: same ModelConfig."""
    (tmp_path / "config.json").write_text(json.dumps(PRESETS[name]))
    transformers.AutoConfig.from_pretrained(tmp_path).save_pretrained(tmp_path / "v5")
    saved = json.loads((tmp_path / "v5" / "config.json").read_text())
    assert "layer_types" in saved and "rope_parameters" in saved
    assert resolve_architecture(saved)[1] == resolve_architecture(PRESETS[name])[1]


@pytest.mark.parametrize("name, key, value, match", [
    ("gemma-3-1b", "attn_logit_softcapping", 50.0, "attn_logit_softcapping=50.0"),  # transformers' Gemma 3 ignores it
    ("gemma-2-9b", "hidden_activation", "gelu", "hidden_activation='gelu'"),
    ("gemma-2-9b", "attention_bias", True, "attention_bias"),
    ("gemma-3-1b", "use_bidirectional_attention", True, "use_bidirectional_attention"),
    ("gemma-3-12b", "rope_scaling", {"rope_type": "yarn", "factor": 8.0}, "rope type 'yarn'"),
    ("gemma-2-9b", "partial_rotary_factor", 0.5, "partial_rotary_factor"),  # MATH_FIELDS Gemma does not read
    ("gemma-2-9b", "layer_types", ["sliding_attention"], "layer_types"),  # 1 entry for 42 layers
])
def test_what_gemma_does_not_do_is_refused_by_name(name, key, value, match):
    with pytest.raises(ValueError, match=match):
        resolve_architecture({**PRESETS[name], key: value})


@pytest.mark.parametrize("key, value", [("attn_logit_softcapping", 50.0), ("final_logit_softcapping", 30.0),
                                        ("query_pre_attn_scalar", 256)])
def test_other_families_still_refuse_gemmas_fields(key, value):
    with pytest.raises(ValueError, match=f"config.json sets {key}="):
        resolve_architecture({**PRESETS["qwen3-0.6b"], key: value})


@pytest.mark.parametrize("name", ["gemma-2-9b", "gemma-3-12b"])
def test_tensor_parallelism_refuses_gemma(name):
    _, config = resolve_architecture(PRESETS[name])
    with pytest.raises(ValueError, match=f"{config.architecture}: tensor parallelism has not been checked"):
        ShardTP.for_model(config, 0, 2, "0")
