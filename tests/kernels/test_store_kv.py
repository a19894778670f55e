"""store_kv writes each token's key and value to its slot exactly like the index_copy_ reference."""

import pytest
import torch

pytest.importorskip("triton")

from graphllm.kernels.store_kv import store_kv, store_kv_reference  # noqa: E402
from tests.kernels.conftest import DEVICE, LOW_DTYPE, ON_GPU, randn  # noqa: E402

CACHE_DTYPES = (torch.float32, LOW_DTYPE) + ((torch.float16,) if ON_GPU else ())


def fused_kv(num_tokens: int, num_kv_heads: int, head_dim: int, seed: int):
    """k, v as strided views into one [T, 3 * Hkv * D] projection output, like a fused qkv."""
    qkv = randn((num_tokens, 3 * num_kv_heads * head_dim), torch.float32, seed)
    k, v = qkv[:, num_kv_heads * head_dim:].view(num_tokens, 2, num_kv_heads, head_dim).unbind(1)
    return k, v  # [T, Hkv, D] each, row stride 3 * Hkv * D


@pytest.mark.parametrize("cache_dtype", CACHE_DTYPES)
@pytest.mark.parametrize("num_tokens, num_kv_heads, head_dim, block_size",
                         [(1, 4, 64, 16), (37, 2, 128, 16), (20, 8, 64, 8), (5, 3, 80, 32)])
def test_store_kv_matches_index_copy(num_tokens, num_kv_heads, head_dim, block_size, cache_dtype):
    num_blocks = 8
    kv_cache = randn((2, num_blocks, block_size, num_kv_heads, head_dim), cache_dtype, seed=1)
    expected = kv_cache.clone()
    gen = torch.Generator().manual_seed(2)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens].to(DEVICE)
    k, v = fused_kv(num_tokens, num_kv_heads, head_dim, seed=3)
    store_kv(k, v, kv_cache, slots)
    store_kv_reference(k, v, expected, slots)
    assert torch.equal(kv_cache, expected)


def test_store_kv_skips_negative_slots():
    kv_cache = randn((2, 4, 16, 2, 64), torch.float32, seed=1)
    expected = kv_cache.clone()
    slots = torch.tensor([5, -1, 17, -1], device=DEVICE)  # padding tokens of a CUDA-graph bucket
    k, v = fused_kv(4, 2, 64, seed=3)
    store_kv(k, v, kv_cache, slots)
    keep = slots >= 0
    store_kv_reference(k[keep], v[keep], expected, slots[keep])
    assert torch.equal(kv_cache, expected)
