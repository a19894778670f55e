"""The float8 KV format of the reference (write_kv_cache, reference_attention): stored as
saturate(x / scale), read as float(x) * scale; a model-dtype cache is a plain cast, as before."""

import math

import pytest
import torch

from graphllm.ops.attention import reference_attention, write_kv_cache
from graphllm.ops.kv_quant import FP8_KV_DTYPE, FP8_MAX, KVScales, dequantize_kv, quantize_kv

SCALES = [KVScales(), KVScales(k=0.25, v=3.0)]


@pytest.mark.parametrize("scale", [1.0, 0.25, 3.0])
def test_round_trip_is_within_float8_precision(scale):
    x = torch.randn(4096, generator=torch.Generator().manual_seed(0)) * 50 * scale
    back = dequantize_kv(quantize_kv(x, FP8_KV_DTYPE, scale), scale)
    assert back.dtype == torch.float32
    inside = x.abs() <= FP8_MAX * scale
    normal = x.abs() >= 2**-6 * scale  # e4m3's smallest normal: below it the error is absolute
    rel = ((back - x).abs() / x.abs())[inside & normal]
    assert rel.max() <= 2**-4  # 3 mantissa bits, round to nearest
    assert ((back - x).abs()[inside & ~normal] <= 2**-10 * scale).all()


def test_saturates_instead_of_overflowing_to_nan():
    x = torch.tensor([1e6, -1e6, 449.0, 460.0, 448.0, float("nan")])
    q = quantize_kv(x, FP8_KV_DTYPE, 1.0)
    assert q.float()[:5].tolist() == [448.0, -448.0, 448.0, 448.0, 448.0]
    assert q.float()[5].isnan()  # a NaN key stays visible


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_model_dtype_cache_is_a_plain_cast(dtype):
    x = torch.randn(64, 8) * 100
    assert torch.equal(quantize_kv(x, dtype, 0.5), x.to(dtype))  # scales ignored
    assert torch.equal(dequantize_kv(x.to(dtype), 0.5), x.to(dtype).float())


def paged_step(num_tokens=13, num_kv_heads=2, head_dim=16, block_size=4, num_blocks=6, seed=0):
    """One prefill of num_tokens into a shuffled set of blocks: k, v, q and the flat metadata."""
    gen = torch.Generator().manual_seed(seed)
    k, v = (torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen) for _ in range(2))
    q = torch.randn(num_tokens, 2 * num_kv_heads, head_dim, generator=gen)
    table = torch.randperm(num_blocks, generator=gen)[:-(-num_tokens // block_size)]
    slots = (table[:, None] * block_size + torch.arange(block_size)).flatten()[:num_tokens]
    meta = (torch.arange(num_tokens), table[None, :], torch.tensor([0, num_tokens]))  # positions, tables, qsl
    return k, v, q, slots, meta, (2, num_blocks, block_size, num_kv_heads, head_dim)


@pytest.mark.parametrize("scales", SCALES)
def test_write_stores_the_quantized_bytes_at_the_slots(scales):
    k, v, _, slots, _, shape = paged_step()
    cache = torch.zeros(shape, dtype=FP8_KV_DTYPE)
    write_kv_cache(k, v, cache, slots, scales)
    flat = cache.view(2, -1, *shape[3:])
    for i, (x, s) in enumerate(((k, scales.k), (v, scales.v))):
        expected = (x / s).clamp(-FP8_MAX, FP8_MAX).to(FP8_KV_DTYPE)
        assert torch.equal(flat[i][slots].view(torch.uint8), expected.view(torch.uint8))
    untouched = torch.ones(flat.shape[1], dtype=torch.bool)
    untouched[slots] = False
    assert (flat[:, untouched].view(torch.uint8) == 0).all()


@pytest.mark.parametrize("sliding_window", [0, 5])
@pytest.mark.parametrize("scales", SCALES)
def test_attention_over_fp8_reads_the_dequantized_cache(scales, sliding_window):
    k, v, q, slots, (positions, tables, qsl), shape = paged_step()
    fp8 = torch.zeros(shape, dtype=FP8_KV_DTYPE)
    write_kv_cache(k, v, fp8, slots, scales)
    as_float = torch.stack([dequantize_kv(fp8[0], scales.k), dequantize_kv(fp8[1], scales.v)])
    scale = 1 / math.sqrt(shape[-1])
    got = reference_attention(q, fp8, positions, tables, qsl, scale, sliding_window, scales)
    expected = reference_attention(q, as_float, positions, tables, qsl, scale, sliding_window)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    exact = torch.zeros(shape)
    write_kv_cache(k, v, exact, slots)
    unquantized = reference_attention(q, exact, positions, tables, qsl, scale, sliding_window)
    error = (got - unquantized).abs().mean() / unquantized.abs().mean()
    assert 0 < error < 0.05  # lossy, but close

