"""Quantized models on the GPU: compiled with --quantization (bf16 activations, graphllm's Triton
quantized-matmul kernels, CUDA graphs) they stay close to the bf16 model.

Teacher forcing over the same random histories as test_attention_backends (sharpened head, so
the top-1 is well defined): each scheme's compiled engine against the eager bf16 engine. The
printed agreements are the measurement; the bounds sit far below them and far above chance
(1/2048), so a wrong kernel or a mis-wired weight fails. Plus: the quantized artifact's weights are
smaller, and batch 1 runs through the CUDA graphs."""

import pytest
import torch

from graphllm import Engine
from graphllm.config import EngineConfig
from tests.conftest import compile_cached
from tests.gpu.test_attention_backends import (LIMITS, agreement, bf16_model, histories_and_reference,  # noqa: F401
                                               teacher_forced_top1)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

MIN_AGREEMENT = {"int8": 0.9, "fp8": 0.8, "int4": 0.6}


@pytest.mark.parametrize("scheme", sorted(MIN_AGREEMENT))
def test_quantized_teacher_forced_agreement(scheme, bf16_model, histories_and_reference):  # noqa: F811
    histories, reference = histories_and_reference
    config = EngineConfig(model=str(bf16_model), dtype="bfloat16", quantization=scheme, **LIMITS)
    art = compile_cached(config, bf16_model)
    bf16_art = compile_cached(EngineConfig(model=str(bf16_model), dtype="bfloat16", **LIMITS), bf16_model)
    assert (art / "weights.safetensors").stat().st_size < 0.75 * (bf16_art / "weights.safetensors").stat().st_size
    engine = Engine.load(art, async_scheduling=False)
    got = teacher_forced_top1(engine, histories)
    assert engine.runner.graphs.replays > 0
    value = agreement(reference, got)
    print(f"{scheme}: teacher-forced top-1 agreement with the eager bf16 engine {value:.4f}")
    assert value >= MIN_AGREEMENT[scheme]
