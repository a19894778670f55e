"""Quantized models on the GPU: compiled with --quantization (bf16 activations, graphllm's Triton
quantized-matmul kernels, CUDA graphs) they stay close to the bf16 model.

Teacher forcing over the same random histories as test_attention_backends (sharpened head, so
the top-1 is well defined): each scheme's compiled engine against the eager bf16 engine. This random
model's logits are nearly flat, so quantization noise flips many top-1s: transformers in bf16 with
the same weights quantized and dequantized (and, for fp8, the activations rounded per token) agrees
with bf16 on 0.926 (int8), 0.636 (fp8) and 0.256 (int4) of the positions (CPU, 2026-11-25; the H200
engine measured 0.916 / 0.624 / 0.253). The bounds sit 4-5 points below that and far above chance
(1/2048), so a wrong kernel or a mis-wired weight fails; the demo eval (tests/test_demo_quantized.py)
measures quality on a trained model. Plus: the quantized artifact's weights are smaller, and decode
runs through the CUDA graphs."""

import json

import pytest
import torch

from graphllm import Engine
from graphllm.config import EngineConfig
from tests.conftest import compile_cached
from tests.gpu.test_attention_backends import (LIMITS, agreement, bf16_model, histories_and_reference,  # noqa: F401
                                               teacher_forced_top1)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

MIN_AGREEMENT = {"int8": 0.88, "fp8": 0.58, "int4": 0.21}


@pytest.mark.parametrize("scheme", sorted(MIN_AGREEMENT))
def test_quantized_teacher_forced_agreement(scheme, bf16_model, histories_and_reference):  # noqa: F811
    histories, reference = histories_and_reference
    config = EngineConfig(model=str(bf16_model), dtype="bfloat16", quantization=scheme, **LIMITS)
    art = compile_cached(config, bf16_model)
    bf16_art = compile_cached(EngineConfig(model=str(bf16_model), dtype="bfloat16", **LIMITS), bf16_model)
    assert (art / "weights.safetensors").stat().st_size < 0.75 * (bf16_art / "weights.safetensors").stat().st_size
    kernels = json.loads((art / "manifest.json").read_text())["quantization"]["kernels"]
    assert all(routes["1"].startswith(f"{scheme}_matmul ") for routes in kernels.values())  # the small-M kernel
    engine = Engine.load(art, async_scheduling=False)
    got = teacher_forced_top1(engine, histories)
    assert engine.runner.graphs.replays > 0
    value = agreement(reference, got)
    print(f"{scheme}: teacher-forced top-1 agreement with the eager bf16 engine {value:.4f}")
    assert value >= MIN_AGREEMENT[scheme]


@pytest.mark.parametrize("scheme", ("fp8",))
def test_linear_prologue_agrees_like_its_scheme(scheme, bf16_model, histories_and_reference):  # noqa: F811
    """--fp8-linear-prologue (norms and SwiGLU inside the fp8 kernel at one row, the same roundings): the scheme's
    agreement bound holds, and the graph holds the fused ops."""
    histories, reference = histories_and_reference
    config = EngineConfig(model=str(bf16_model), dtype="bfloat16", quantization=scheme,
                          **{f"{scheme}_linear_prologue": True}, **LIMITS)
    art = compile_cached(config, bf16_model)
    passes = {p["name"]: p for p in json.loads((art / "manifest.json").read_text())["passes"]}
    assert passes["linear_prologue"]["counts"]["add_rms_norm"] > 0 and passes["linear_prologue"]["skipped"] is None
    engine = Engine.load(art, async_scheduling=False)
    value = agreement(reference, teacher_forced_top1(engine, histories))
    print(f"{scheme} with the linear prologue: teacher-forced top-1 agreement with the eager bf16 engine {value:.4f}")
    assert engine.runner.graphs.replays > 0 and value >= MIN_AGREEMENT[scheme]


@pytest.mark.parametrize("rows", [1, 16, 300])
def test_inductor_fp8_quantize_is_the_reference(rows):
    """quantize_fp8_activations hands fp8_quantize to Inductor (its reference as the decomposition), fused
    after a norm. Each scale within one ulp of the CPU reference's (Inductor may not divide max|x| by 448
    correctly rounded) and each float8 value within one float8 step of the reference quantization."""
    from graphllm.compiler.decompositions import inductor_decompositions
    from graphllm.kernels import quant_layout as Q

    def norm_then_quantize(x, w):
        normed = torch.ops.graphllm.rms_norm(x, w, 1e-5)
        return normed, *torch.ops.graphllm.fp8_quantize(normed)

    gen = torch.Generator().manual_seed(rows)
    x = (torch.randn(rows, 4096, generator=gen) * 3).to(torch.bfloat16)
    w = (1 + 0.1 * torch.randn(4096, generator=gen)).to(torch.bfloat16)
    # the compile pipeline's setting (compiler/inductor_lowering.py): without it Inductor skips the norm's
    # rounding to bfloat16 before the quantization (scales 0.1% off, measured on the H200)
    with inductor_decompositions(), torch._inductor.config.patch(emulate_precision_casts=True):
        compiled = torch.compile(norm_then_quantize, fullgraph=True, dynamic=False)
        normed, xq, scale = compiled(x.cuda(), w.cuda())
    want_q, want_scale = Q.quantize_fp8_rows(normed.cpu())
    scale = scale.cpu()
    ulp = torch.nextafter(want_scale, torch.full_like(want_scale, 1.0)) - want_scale
    assert torch.all((scale - want_scale).abs() <= ulp)
    step = want_q.float().abs() * 2.0 ** -3 + 2.0 ** -9  # one float8 e4m3 step at that magnitude
    got = xq.cpu().float()
    assert torch.all((got - want_q.float()).abs() <= step)
    print(f"rows {rows}: scales off by one ulp {(scale != want_scale).sum().item()} / {rows}, float8 values "
          f"off by one step {(got != want_q.float()).sum().item()} / {got.numel()}")


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() < (9, 0),
                    reason="programmatic dependent launch needs sm_90")
@pytest.mark.parametrize("scheme", ["fp8", "int4"])
def test_programmatic_launch_gives_the_same_rows(scheme, bf16_model, histories_and_reference):  # noqa: F811
    """enable_pdl: the fp8 and int4 decode linears (with rope + KV store and decode attention) launched as
    programmatic dependents in the decode graphs compute what the plain launches do, row for row."""
    histories, _ = histories_and_reference
    rows = {}
    for pdl in (False, True):
        art = compile_cached(EngineConfig(model=str(bf16_model), dtype="bfloat16", quantization=scheme,
                                          enable_pdl=pdl, **LIMITS), bf16_model)
        engine = Engine.load(art, attention_backend="triton", async_scheduling=False, enable_pdl=pdl)
        rows[pdl] = teacher_forced_top1(engine, histories[:8])
        assert engine.runner.graphs.replays > 0
        del engine
    assert rows[True] == rows[False]


def test_int4_folds_keep_the_agreement(bf16_model, histories_and_reference):  # noqa: F811
    """int4 with --linear-epilogue and --row-sumsq (SwiGLU in gate_up's finish; the norms split between the int4
    products around them): the graph holds the folded ops, and int4's agreement bound holds."""
    histories, reference = histories_and_reference
    config = EngineConfig(model=str(bf16_model), dtype="bfloat16", quantization="int4", linear_epilogue=True,
                          row_sumsq=True, **LIMITS)
    art = compile_cached(config, bf16_model)
    passes = {p["name"]: p for p in json.loads((art / "manifest.json").read_text())["passes"]}
    assert passes["linear_epilogue"]["counts"]["none"] > 0 and passes["row_sumsq"]["counts"]["int4"] > 0
    engine = Engine.load(art, async_scheduling=False)
    value = agreement(reference, teacher_forced_top1(engine, histories))
    print(f"int4 with the epilogue and the norm pair: teacher-forced top-1 agreement with the eager bf16 engine "
          f"{value:.4f}")
    assert engine.runner.graphs.replays > 0 and value >= MIN_AGREEMENT["int4"]


def test_int4_mma_keeps_the_agreement(bf16_model, histories_and_reference):  # noqa: F811
    """int4 with --int4-mma (kernels/int4_mma.py, opt-in): every int4 linear in the tensor-core layout (this model's
    512 / 1024 widths tile), decode on that kernel and prefill on the dequantized weight; int4's agreement bound
    holds, and teacher forcing gives the GPTQ-layout engine's tokens but for rounding-order ties."""
    histories, reference = histories_and_reference
    config = EngineConfig(model=str(bf16_model), dtype="bfloat16", quantization="int4", int4_mma=True, **LIMITS)
    art = compile_cached(config, bf16_model)
    passes = {p["name"]: p for p in json.loads((art / "manifest.json").read_text())["passes"]}
    assert passes["int4_mma_layout"]["counts"] == {"linears": 16, "kept": 0}  # 4 layers x (qkv, o, gate_up, down)
    engine = Engine.load(art, async_scheduling=False)
    value = agreement(reference, teacher_forced_top1(engine, histories))
    print(f"int4 on the MMA layout: teacher-forced top-1 agreement with the eager bf16 engine {value:.4f}")
    assert engine.runner.graphs.replays > 0 and value >= MIN_AGREEMENT["int4"]
