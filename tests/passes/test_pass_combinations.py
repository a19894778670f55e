"""Compile switches that each pass alone but broke together (CPU, float32): found by s36's combinatorial sweep over
CompileConfig's switches and the runtime's options, each pinned here with the smallest compile that showed it."""

from pathlib import Path

import torch

from graphllm import Engine, SamplingParams
from graphllm.compiler.cache import compiled_artifact
from graphllm.config import CompileConfig
from tests.conftest import TEST_CACHE_DIR

PROMPTS = [[1, 5, 9, 17, 33, 65, 100], [1] + list(range(10, 40))]
NEW_TOKENS = 16


def transformers_tokens(hf) -> list[list[int]]:
    outs = []
    for prompt in PROMPTS:
        with torch.no_grad():
            out = hf.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None,
                              pad_token_id=0)
        outs.append(out[0, len(prompt):].tolist())
    return outs


def compiled_tokens(folder, config: CompileConfig, **options) -> list[list[int]]:
    art = compiled_artifact(folder, config, torch.device("cpu"), Path(TEST_CACHE_DIR) / "artifacts",
                            show_progress=False)
    engine = Engine.load(str(art), **options)
    outs = engine.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True))
    return [o.outputs[0].token_ids for o in outs]


def test_inductor_lowering_with_a_block_size_other_than_16_runs(tiny_model_dir):
    # the capture's example KV caches had 16-token blocks whatever block_size said, and Inductor's step asserts
    # its inputs' sizes: every step of an artifact compiled with lowering inductor and block_size 8 failed
    folder, hf = tiny_model_dir("llama")
    config = CompileConfig(dtype="float32", lowering="inductor", block_size=8, max_num_seqs=2,
                           max_num_batched_tokens=16)
    assert compiled_tokens(folder, config) == transformers_tokens(hf)
