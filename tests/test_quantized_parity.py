"""Pre-quantized checkpoints through the whole pipeline (load, quantize pass, fusions, AOTInductor,
Engine.load) give transformers' greedy tokens on the same dequantized weights (CPU, float32).

transformers runs a plain float folder holding each checkpoint's dequantized weights (written by
tests/quantized_checkpoints.py with the libraries' own dequantization). For FP8 W8A8 the
activations are quantized too: transformers' quantized Linears get a pre-hook rounding their input
to float8 per token (or with the static input_scale), as graphllm's fp8_linear does.
"""

import pytest
import torch
import transformers
from safetensors import safe_open

from graphllm import Engine, EngineConfig, SamplingParams
from graphllm.compiler.artifact import read_manifest
from graphllm.kernels import quant_layout as Q
from tests.conftest import compile_cached
from tests.quantized_checkpoints import (write_awq_folder, write_ct_fp8_folder, write_ct_w4a16_folder,
                                         write_dequantized_folder, write_gptq_folder)

PROMPTS = [[1, 5, 9, 17, 33, 65, 100], [1, 42], [1] + list(range(10, 40))]
NEW_TOKENS = 24
FORMATS = {
    "gptq-sym": lambda p: write_gptq_folder(p, "llama", sym=True),
    "gptq-asym-qwen2": lambda p: write_gptq_folder(p, "qwen2", sym=False),
    "awq": lambda p: write_awq_folder(p, "llama"),
    "ct-w4a16": lambda p: write_ct_w4a16_folder(p, "qwen3"),
    "ct-fp8-dynamic": lambda p: write_ct_fp8_folder(p, "llama", weight_strategy="channel", dynamic=True),
    "ct-fp8-static-tensor": lambda p: write_ct_fp8_folder(p, "llama", weight_strategy="tensor", dynamic=False),
}


def fp8_activation_hooks(model, folder) -> None:
    """Round each quantized linear's input as W8A8 does: per token, or with its static input_scale."""
    with safe_open(folder / "model.safetensors", "pt") as f:
        names = set(f.keys())
        static = {n.removesuffix(".input_scale"): f.get_tensor(n) for n in names if n.endswith(".input_scale")}
    quantized = {n.removesuffix(".weight_scale") for n in names if n.endswith(".weight_scale")}
    for name, module in model.named_modules():
        if name in quantized:
            scale = static.get(name)

            def hook(_, args, scale=scale):
                x = args[0]
                rows = x.reshape(-1, x.shape[-1])
                xq, s = Q.quantize_fp8_rows(rows, scale)
                return ((xq.float() * s).to(x.dtype).view(x.shape),)
            module.register_forward_pre_hook(hook)


def transformers_tokens(folder, dequantized) -> list[list[int]]:
    model = transformers.AutoModelForCausalLM.from_pretrained(dequantized, dtype=torch.float32).eval()
    if "fp8" in folder.name:
        fp8_activation_hooks(model, folder)
    outs = []
    for prompt in PROMPTS:
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)
        outs.append(out[0, len(prompt):].tolist())
    return outs


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_prequantized_checkpoint_matches_transformers_on_dequantized_weights(name, tmp_path):
    folder = FORMATS[name](tmp_path / name)
    expected = transformers_tokens(folder, write_dequantized_folder(folder, tmp_path / f"{name}-dequantized"))
    art = compile_cached(EngineConfig(model=str(folder)), folder)
    manifest = read_manifest(art)
    assert manifest["quantization"]["source"] in ("gptq", "awq", "compressed-tensors")
    assert manifest["quantization"]["quantized"] > 0
    engine = Engine.load(art)
    outs = engine.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True))
    assert [o.outputs[0].token_ids for o in outs] == expected
