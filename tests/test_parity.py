"""Greedy tokens equal transformers' generate for every architecture we claim (CPU, float32),
eager and compiled (an artifact from the full pass pipeline, loaded with Engine.load).

Also under forced preemption (a KV pool too small for the batch) and with prefill chunks
shorter than the prompts.
"""

import pytest
import torch

from graphllm import Engine, SamplingParams
from tests.conftest import ARCHS

PROMPTS = [[1, 5, 9, 17, 33, 65, 100], [1, 42], [1] + list(range(10, 40)), [1, 7, 7, 7, 90, 3, 4, 5, 6, 120, 11]]
NEW_TOKENS = 32

# name -> engine options; each must still produce transformers' tokens
SETTINGS = {
    "plain": dict(),
    "preemption": dict(num_kv_blocks=4, max_model_len=64),  # 64 slots (4 blocks of 16) for 4 sequences
    "chunked": dict(max_num_batched_tokens=5),  # every prompt longer than 2 is prefilled in chunks
}


@pytest.fixture(scope="module")
def reference_tokens(tiny_model_dir):
    """arch -> transformers' greedy continuation of each prompt (run one prompt at a time)."""
    cache = {}

    def get(arch):
        if arch not in cache:
            _, hf = tiny_model_dir(arch)
            outs = []
            for prompt in PROMPTS:
                with torch.no_grad():
                    out = hf.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False,
                                      eos_token_id=None, pad_token_id=0)
                outs.append(out[0, len(prompt):].tolist())
            cache[arch] = outs
        return cache[arch]

    return get


@pytest.mark.parametrize("kind", ["eager", "compiled"])
@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_matches_transformers(arch, setting, kind, tiny_model_dir, compiled_dir, reference_tokens):
    if kind == "eager":
        engine = Engine.from_pretrained(tiny_model_dir(arch)[0], **SETTINGS[setting])
    else:
        engine = Engine.load(compiled_dir(arch), **SETTINGS[setting])
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    outs = engine.generate(PROMPTS, params)
    got = [o.outputs[0].token_ids for o in outs]
    assert got == reference_tokens(arch)
    if setting == "preemption":
        assert engine.scheduler.num_preemptions > 0
    if setting == "chunked":
        assert engine.state.limits.max_num_batched_tokens < min(len(p) for p in PROMPTS[0:1] + PROMPTS[2:])
    assert engine.pool.num_free_blocks == engine.pool.num_blocks
