"""Tensor parallelism on one node, CPU and gloo: an engine with tensor_parallel_size N starts N-1 worker
processes, each running its shard of the captured step, and generates transformers' greedy tokens
(so the same as N = 1), including GQA with fewer KV heads than ranks and a tied embedding with q/k/v
bias; stopping it leaves no worker process behind."""

import pytest
import torch

from graphllm import Engine, SamplingParams

pytestmark = pytest.mark.slow  # starts worker processes

PROMPTS = [[1, 5, 9, 17, 33, 65, 100], [1, 42], [1] + list(range(10, 40))]
GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)


def transformers_tokens(hf) -> list[list[int]]:
    outs = []
    for prompt in PROMPTS:
        with torch.no_grad():
            out = hf.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False, eos_token_id=None,
                              pad_token_id=0)
        outs.append(out[0, len(prompt):].tolist())
    return outs


# tiny configs: 4 query heads, 2 KV heads; qwen2 ties its embedding and has q/k/v bias
@pytest.mark.parametrize("arch, world_size", [("llama", 2), ("qwen2", 2), ("llama", 4)])
def test_greedy_tokens_equal_transformers(arch, world_size, tiny_model_dir):
    path, hf = tiny_model_dir(arch)
    engine = Engine.from_pretrained(path, tensor_parallel_size=world_size)
    step = engine.runner.step
    try:
        assert len(step.workers) == world_size - 1 and all(p.is_alive() for p in step.workers)
        assert engine.runner.kv_caches[0].shape[3] == max(2 // world_size, 1)  # this rank's KV heads
        outs = engine.generate(PROMPTS, GREEDY)
        assert [o.outputs[0].token_ids for o in outs] == transformers_tokens(hf)
    finally:
        step.stop()
    assert not any(p.is_alive() for p in step.workers) and all(p.exitcode == 0 for p in step.workers)


def test_what_is_not_wired_yet_is_refused_by_name(tiny_model_dir):
    path, _ = tiny_model_dir("llama")
    with pytest.raises(ValueError, match="runs eager on the CPU for now; not with compile=True, quantization"):
        Engine.from_pretrained(path, tensor_parallel_size=2, compile=True, quantization="int8")
    with pytest.raises(ValueError, match="tensor_parallel_size must be >= 1"):
        Engine.from_pretrained(path, tensor_parallel_size=0)


def test_a_head_count_that_does_not_divide_is_refused_with_the_numbers(tiny_model_dir):
    path, _ = tiny_model_dir("llama")
    with pytest.raises(ValueError, match="tensor-parallel size 3 does not divide 4 attention heads"):
        Engine.from_pretrained(path, tensor_parallel_size=3)


def test_the_check_comes_before_any_worker_starts(tiny_model_dir):
    import torch.distributed as dist
    path, _ = tiny_model_dir("llama")
    with pytest.raises(ValueError, match="does not divide"):
        Engine.from_pretrained(path, tensor_parallel_size=3)
    assert not dist.is_initialized()  # no group was formed, so none is left behind
