"""The triton attention backend inside the engine: the same greedy tokens as the PyTorch
reference backend (float32), through prefill, chunked prefill (8-token budget) and decode, for
grouped-query attention (llama), a sliding window (mistral), head_dim 32 (qwen3), Gemma's per-layer
windows, query_pre_attn_scalar and attention-logit soft cap (gemma2, gemma3), with a KV
cache of the model's dtype or a float8 one (kv_cache_dtype="fp8", both backends quantizing alike).
On CPU the kernels run under Triton's interpreter (see conftest.py)."""

import pytest
import torch

pytest.importorskip("triton")

from graphllm import Engine, SamplingParams  # noqa: E402
from tests.kernels.conftest import DEVICE, ON_GPU, record_split_launches  # noqa: E402
from tests.kernels.test_store_kv import INTERPRETER_FP8_ROUNDING  # noqa: E402

PROMPTS = [[1, 5, 9, 17, 33], [1, 42], list(range(3, 24))]
GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)


@pytest.mark.parametrize("kv_cache_dtype", [
    "auto", pytest.param("fp8", marks=pytest.mark.skipif(not ON_GPU, reason=INTERPRETER_FP8_ROUNDING))])
@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen3", "gemma2", "gemma3"])
def test_triton_backend_gives_the_reference_tokens(arch, kv_cache_dtype, tiny_model_dir):
    path, _ = tiny_model_dir(arch)
    options = dict(dtype="float32", device=DEVICE.type, cuda_graphs=False, max_num_batched_tokens=8,
                   kv_cache_dtype=kv_cache_dtype)
    expected = Engine.from_pretrained(path, attention_backend="torch", **options).generate(PROMPTS, GREEDY)
    engine = Engine.from_pretrained(path, attention_backend="triton", **options)
    assert engine.runner.backend.name == "triton"
    assert engine.state.kv_cache_dtype == (torch.float8_e4m3fn if kv_cache_dtype == "fp8" else torch.float32)
    got = engine.generate(PROMPTS, GREEDY)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in expected]


@pytest.mark.parametrize("arch", ["deepseek_v2", "deepseek_v2-qlora"])  # latent 32 + rope 8; 24 + 16
def test_triton_backend_gives_the_reference_tokens_for_mla(arch, tiny_model_dir):
    """Chunked prefill (8-token budget) makes mixed steps: prompts chunked while others decode."""
    path, _ = tiny_model_dir(arch)
    options = dict(dtype="float32", device=DEVICE.type, cuda_graphs=False, max_num_batched_tokens=8)
    expected = Engine.from_pretrained(path, attention_backend="torch", **options).generate(PROMPTS, GREEDY)
    engine = Engine.from_pretrained(path, attention_backend="triton", **options)
    assert engine.runner.backend.name == "triton"
    got = engine.generate(PROMPTS, GREEDY)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in expected]


@pytest.mark.parametrize("arch", ["llama", "gemma2"])
def test_verify_steps_take_the_verify_kernel_and_the_reference_tokens(arch, tiny_model_dir, monkeypatch):
    """Speculative decoding (prompt lookup, k = 4): its verify steps, 2..5 tokens a sequence, run
    paged_verify_attention (counted: its max_tokens argument), and the tokens are the plain reference
    backend's."""
    import graphllm.backends.triton_backend as triton_backend
    path, _ = tiny_model_dir(arch)
    calls = []
    kernel = triton_backend.paged_verify_attention
    monkeypatch.setattr(triton_backend, "paged_verify_attention", lambda *a, **k: calls.append(a[8]) or kernel(*a, **k))
    monkeypatch.setattr(triton_backend.TritonBackend, "verify_kernel", True)  # off by default (see there)
    options = dict(dtype="float32", device=DEVICE.type, cuda_graphs=False)
    prompts = [[1, 5, 9, 17, 5, 9, 17, 5], [1, 7, 7, 7, 7]]
    expected = Engine.from_pretrained(path, attention_backend="torch", **options).generate(prompts, GREEDY)
    spec = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    engine = Engine.from_pretrained(path, attention_backend="triton", speculative_config=spec, **options)
    got = engine.generate(prompts, GREEDY)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in expected]
    # the prompts (8 and 5 tokens) take it too: every sequence of their prefill step has at most 16 new tokens
    assert 8 in calls and any(2 <= c <= 5 for c in calls) and engine.stats().spec_decode.num_accepted_tokens > 0


@pytest.mark.parametrize("arch", ["llama"])  # one model: ~12 s on CPU (a compile)
def test_decode_rope_fusion_over_splits_gives_the_reference_tokens(arch, tiny_model_dir, tmp_path, monkeypatch):
    """fuse_rope_decode over several KV splits: the decode kernel rotates and stores the new token itself
    (kernels/rope_decode.py) and the reduce kernel merges the splits; the reference tokens, with every launch of
    the split kernel rotating. The step is compiled with the fuse_rope_attention pass forced on (on CPU too), which
    hands the backend graphllm.rope_attention. Three splits at every decode step, as a long context would take."""
    import graphllm.kernels.paged_decode_attention as decode
    from graphllm.compiler.pipeline import compile_model
    from graphllm.config import CompileConfig
    from graphllm.passes.fusion.fuse_rope_attention import FuseRopeAttention
    path, _ = tiny_model_dir(arch)
    options = dict(device=DEVICE.type, cuda_graphs=False, max_num_batched_tokens=8)
    expected = Engine.from_pretrained(path, attention_backend="torch", dtype="float32", **options).generate(
        PROMPTS, GREEDY)
    monkeypatch.setattr(FuseRopeAttention, "devices", ("cpu", "cuda"))  # what the pass manager reads
    compile_model(path, tmp_path / "art", CompileConfig(dtype="float32", max_num_seqs=4, max_num_batched_tokens=64,
                                                        lowering="inductor"),  # AOTInductor's build: 3x the time
                  DEVICE.type, show_progress=False)
    monkeypatch.setattr(decode, "decode_num_splits", lambda *shapes: 3)
    launches = record_split_launches(monkeypatch)
    engine = Engine.load(tmp_path / "art", attention_backend="triton", fuse_rope_decode=True, **options)
    got = engine.generate(PROMPTS, GREEDY)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in expected]
    assert launches and all(kw.get("ROPE", False) and grid[2] == 3 for grid, kw in launches)
