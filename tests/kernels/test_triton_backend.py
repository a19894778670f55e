"""The triton attention backend inside the engine: the same greedy tokens as the PyTorch
reference backend (float32), through prefill, chunked prefill (8-token budget) and decode, for
grouped-query attention (llama), a sliding window (mistral) and head_dim 32 (qwen3), with a KV
cache of the model's dtype or a float8 one (kv_cache_dtype="fp8", both backends quantizing alike).
On CPU the kernels run under Triton's interpreter (see conftest.py)."""

import pytest
import torch

pytest.importorskip("triton")

from graphllm import Engine, SamplingParams  # noqa: E402
from tests.kernels.conftest import DEVICE, ON_GPU  # noqa: E402
from tests.kernels.test_store_kv import INTERPRETER_FP8_ROUNDING  # noqa: E402

PROMPTS = [[1, 5, 9, 17, 33], [1, 42], list(range(3, 24))]
GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)


@pytest.mark.parametrize("kv_cache_dtype", [
    "auto", pytest.param("fp8", marks=pytest.mark.skipif(not ON_GPU, reason=INTERPRETER_FP8_ROUNDING))])
@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen3"])
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


@pytest.mark.parametrize("new_tokens", [[1, 1, 4, 1, 3], [1, 1, 1, 1, 2], [3, 1, 1], [1, 1, 1]])
def test_mixed_step_splits_its_leading_decodes_and_matches_the_reference(new_tokens):
    """plan() counts the leading one-token sequences of a mixed step; they take the decode kernel,
    the rest the prefill kernel, and together they give the reference's attention."""
    import numpy as np
    from graphllm.ops.backends import HostMeta, TorchBackend
    from graphllm.ops.backends.triton_backend import TritonBackend
    from tests.kernels.conftest import assert_close, make_paged_kv, randn
    heads, kv_heads, head_dim, block_size = 8, 2, 64, 16
    seq_lens = [c + n for c, n in zip([30, 7, 18, 40, 2], new_tokens)]
    kv_cache, tables = make_paged_kv(seq_lens, block_size, kv_heads, head_dim, torch.float32, seed=4)
    kv_cache = kv_cache.nan_to_num(0.0)  # the reference's einsum reads masked slots too
    starts = np.concatenate([[0], np.cumsum(new_tokens)])
    positions = [p for n, total in zip(new_tokens, seq_lens) for p in range(total - n, total)]
    slots = [int(tables[b, p // block_size]) * block_size + p % block_size
             for b, (n, total) in enumerate(zip(new_tokens, seq_lens)) for p in range(total - n, total)]
    t = lambda x: torch.as_tensor(np.asarray(x), device=DEVICE)  # noqa: E731
    q, k, v = (randn((len(positions), h, head_dim), torch.float32, seed=s) for s, h in ((5, heads), (6, kv_heads),
                                                                                            (7, kv_heads)))
    args = (t(positions), t(slots), tables, t(seq_lens), t(starts), head_dim ** -0.5, 0)
    backend = TritonBackend()
    backend.plan(HostMeta(starts, np.asarray(seq_lens), tables.cpu().numpy()))
    leading = next((i for i, n in enumerate(new_tokens) if n != 1), 0)
    assert backend._mixed == ((len(positions), len(new_tokens), leading) if leading else None)
    ref_cache = kv_cache.clone()
    expected = TorchBackend().forward(q, k, v, ref_cache, *args)
    assert_close(backend.forward(q, k, v, kv_cache, *args), expected)
    assert_close(kv_cache, ref_cache)
