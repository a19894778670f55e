"""On a GPU: the one-row MoE passes in a bf16 Qwen3-MoE engine, each against the same engine without it. Decoding
one sequence at a time (the one-row graph), the teacher-forced top-1 rows differ from those without the pass no
more often than transformers' own bf16 forward differs from that engine:
- shared_norm_prologue (the router's launch takes the post-attention norm and stores it for the experts): the
  norm's mean square is summed in another order than Inductor's norm kernel sums it, and a router whose top experts
  lie within bf16 rounding of each other then picks others (H100, 2026-12-06: 0.947 the same, against a first bound
  of 0.98 that took no account of the routing);
- fuse_moe_router (the router's GEMV and the expert choice in one launch): the logits are summed in another
  order than skinny_matmul's split-K sums them, with the same effect on near ties."""

import dataclasses
from pathlib import Path

import pytest
import torch
import transformers

from graphllm import Engine
from graphllm.config import EngineConfig
from tests.conftest import compile_cached
from tests.gpu.helpers import sharpened_model_folder
from tests.gpu.test_attention_backends import FORCED_LEN, LIMITS, NUM_SEQS, PROMPT_LEN, agreement, teacher_forced_top1

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.fixture(scope="module")
def bf16_moe(tmp_path_factory):
    """A Qwen3-MoE with 8 experts, 2 a token, hidden 512 (the router [8, 512] and o_proj run skinny_matmul at one
    row), random weights and a sharpened head."""
    config = transformers.Qwen3MoeConfig(vocab_size=2048, hidden_size=512, intermediate_size=1024,
                                         moe_intermediate_size=256, num_experts=8, num_experts_per_tok=2,
                                         norm_topk_prob=True, num_hidden_layers=4, num_attention_heads=4,
                                         num_key_value_heads=2, head_dim=128, max_position_embeddings=512,
                                         initializer_range=0.05, tie_word_embeddings=False)
    return sharpened_model_folder(transformers.Qwen3MoeForCausalLM, config, tmp_path_factory.mktemp("bf16-qwen3-moe"))


PASSES = [("shared_norm_prologue", "graphllm.add_rms_norm_linear_normed"), ("fuse_moe_router", "graphllm.fused_moe_routed")]


@pytest.mark.parametrize("switch, op", PASSES)
def test_one_row_rows_with_and_without_the_pass(bf16_moe, switch, op):
    gen = torch.Generator().manual_seed(0)
    histories = torch.randint(3, 2048, (NUM_SEQS, PROMPT_LEN + FORCED_LEN), generator=gen).tolist()
    config = EngineConfig(model=str(bf16_moe), dtype="bfloat16", **LIMITS)
    arts = {on: compile_cached(dataclasses.replace(config, **{switch: on}), bf16_moe) for on in (False, True)}
    after = (Path(arts[True]) / "graphs" / "after.txt").read_text()
    assert after.count(op) == 4  # each layer's post-attention norm / router
    rows = {}
    for on in (False, True):
        engine = Engine.load(arts[on], attention_backend="triton", async_scheduling=False)
        rows[on] = [row for history in histories for row in teacher_forced_top1(engine, [history])]
        assert engine.runner.graphs.replays >= NUM_SEQS * (FORCED_LEN - 1)
        del engine
    same = agreement(rows[False], rows[True])
    model = transformers.AutoModelForCausalLM.from_pretrained(bf16_moe, dtype=torch.bfloat16).cuda().eval()
    with torch.no_grad():  # the noise floor: transformers' bf16 forward against the engine without the pass
        logits = model(torch.tensor(histories, device="cuda")).logits  # [B, S, V]
    floor = agreement(rows[False], logits[:, PROMPT_LEN - 1:PROMPT_LEN - 1 + FORCED_LEN].argmax(-1).tolist())
    print(f"{switch}, 1 row: teacher-forced top-1 agreement with the engine without it {same:.4f}; "
          f"transformers bf16 with that engine {floor:.4f}")
    assert same >= min(floor, 0.98) - 0.02 and same >= 0.8
