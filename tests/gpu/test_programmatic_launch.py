"""On an sm_90+ GPU: skinny_matmul launched as programmatic dependents (graphllm/kernels/launch.py) inside a CUDA
graph, kernel after kernel as a decode layer chains them, gives the plain launches' bits. (The whole layer, rope +
KV store and decode attention included, is tests/gpu/test_attention_backends.py's programmatic-launch test.)"""

import pytest
import torch

from graphllm.kernels.launch import launches_dependent, programmatic_launch
from graphllm.kernels.skinny_matmul import rms_norm_matmul, silu_mul_matmul, skinny_matmul

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0), reason="needs an sm_90+ GPU")]

SPLIT = {"BLOCK_N": 32, "BLOCK_K": 128, "SPLIT_K": 4, "num_warps": 4, "num_stages": 4}  # the split-K counters too


def layer_chain(x, residual, w):
    """add_rms_norm -> qkv, o_proj (split K), add_rms_norm -> gate_up, silu_mul -> down: each reads the last."""
    qkv, h = rms_norm_matmul(x, w["norm1"], 1e-5, w["qkv"], residual=residual)
    o = skinny_matmul(qkv[:, :256].contiguous(), w["o_proj"], config=SPLIT)
    gate_up, h = rms_norm_matmul(o, w["norm2"], 1e-5, w["gate_up"], residual=h)
    return silu_mul_matmul(gate_up, w["down"]), h


def test_graph_of_dependent_launches_matches_plain_launches():
    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    w = {"qkv": torch.randn(384, 256, device=dev, dtype=dt) / 16, "o_proj": torch.randn(256, 256, device=dev, dtype=dt) / 16,
         "gate_up": torch.randn(1024, 256, device=dev, dtype=dt) / 16,
         "down": torch.randn(256, 512, device=dev, dtype=dt) / 23,
         "norm1": 1 + torch.randn(256, device=dev, dtype=dt) / 4, "norm2": 1 + torch.randn(256, device=dev, dtype=dt) / 4}
    x, residual = torch.randn(1, 256, device=dev, dtype=dt), torch.randn(1, 256, device=dev, dtype=dt)
    expected = layer_chain(x, residual, w)
    with programmatic_launch(True):
        assert launches_dependent(x.device)
        layer_chain(x, residual, w)  # compile and warm up outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = x
            for _ in range(4):  # four layers back to back: each kernel's input is the one before's output
                out, residual_out = layer_chain(out, residual, w)
    graph.replay()
    torch.cuda.synchronize()
    reference, ref_residual = x, residual
    for _ in range(4):
        reference, ref_residual_out = layer_chain(reference, residual, w)
    assert torch.equal(out, reference) and torch.equal(residual_out, ref_residual_out)
    assert torch.equal(layer_chain(x, residual, w)[0], expected[0])


@pytest.mark.parametrize("arch", ["llama", "qwen3_moe"])
def test_engines_with_programmatic_launch_give_the_same_tokens(arch, tiny_model_dir):
    """A bf16 engine compiled and run with enable_pdl (the decode step's kernels, the MoE routing and expert
    kernels among them, and Inductor's) gives the greedy tokens of the same engine without it."""
    from graphllm import Engine, SamplingParams
    from graphllm.config import EngineConfig
    from tests.conftest import compile_cached
    path, _ = tiny_model_dir(arch)
    prompts = [[1, 5, 9, 17, 33], [1, 42], list(range(3, 40))]
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    outs = {}
    for pdl in (False, True):
        art = compile_cached(EngineConfig(model=str(path), dtype="bfloat16", enable_pdl=pdl), path)
        engine = Engine.load(art, enable_pdl=pdl)
        outs[pdl] = [o.outputs[0].token_ids for o in engine.generate(prompts, greedy)]
        assert engine.runner.graphs.replays > 0
        del engine
    assert outs[True] == outs[False]
