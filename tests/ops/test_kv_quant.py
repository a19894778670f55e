"""The float8 KV format of the reference (write_kv_cache, reference_attention): stored as
saturate(x / scale), read as float(x) * scale; a model-dtype cache is a plain cast, as before.
On a GPU, the triton and flashinfer backends store the same bytes and read them alike."""

import math

import numpy as np
import pytest
import torch

from graphllm.kernels.reference import reference_attention, write_kv_cache
from graphllm.backends import AttentionShape, HostMeta, TorchBackend, select_backend
from graphllm.kernels.kv_quant import FP8_KV_DTYPE, FP8_MAX, KVScales, dequantize_kv, quantize_kv

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


# (cached, new) tokens per sequence: a prefill step with a chunked prefix and a decoding row, and a decode step
PREFILL_STEP, DECODE_STEP = [(0, 37), (20, 5), (50, 1)], [(40, 1), (130, 1), (7, 1)]
GPU_CONFIG = AttentionShape(num_heads=4, num_kv_heads=2, head_dim=128)


def gpu_step(chunks, scales: KVScales, block_size=16, seed=0, device="cuda"):
    """Attention op inputs for one step on the GPU over an fp8 cache already holding the cached tokens."""
    heads, kv_heads, head_dim = GPU_CONFIG.num_heads, GPU_CONFIG.num_kv_heads, GPU_CONFIG.head_dim
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [cached + new for cached, new in chunks]
    counts = [-(-n // block_size) for n in seq_lens]
    pool = torch.randperm(sum(counts) + 2, generator=gen).tolist()
    tables = torch.zeros(len(chunks), max(counts), dtype=torch.int64)
    for b, count in enumerate(counts):
        tables[b, :count] = torch.tensor([pool.pop() for _ in range(count)])
    positions = torch.cat([torch.arange(cached, cached + new) for cached, new in chunks])
    rows = torch.cat([torch.full((new,), b) for b, (_, new) in enumerate(chunks)])
    slots = tables[rows, positions // block_size] * block_size + positions % block_size
    cache = torch.zeros((2, sum(counts) + 2, block_size, kv_heads, head_dim), dtype=FP8_KV_DTYPE)
    for b, (cached, _) in enumerate(chunks):  # the prefix, as an earlier step stored it
        pos = torch.arange(cached)
        write_kv_cache(*torch.randn(2, cached, kv_heads, head_dim, generator=gen), cache,
                       tables[b, pos // block_size] * block_size + pos % block_size, scales)
    num_tokens = len(positions)
    q, k, v = (torch.randn(num_tokens, h, head_dim, generator=gen) for h in (heads, kv_heads, kv_heads))
    qsl = torch.tensor([0] + [new for _, new in chunks]).cumsum(0)
    host = HostMeta(qsl.numpy(), np.array(seq_lens), tables.numpy())
    half = dict(device=device, dtype=torch.bfloat16)
    args = (q.to(**half), k.to(**half), v.to(**half), cache.to(device), positions.to(device), slots.to(device),
            tables.to(device), torch.tensor(seq_lens, device=device), qsl.to(device), head_dim ** -0.5, 0)
    return host, args


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("graph_decoder", [False, True])
@pytest.mark.parametrize("chunks", [PREFILL_STEP, DECODE_STEP])
@pytest.mark.parametrize("scales", SCALES)
@pytest.mark.parametrize("name", ["triton"])
def test_gpu_backend_writes_and_reads_fp8_like_the_reference(name, scales, chunks, graph_decoder):
    """The same cache bytes as the reference backend, and its output within bfloat16 tolerance."""
    import importlib.util
    if name == "flashinfer" and importlib.util.find_spec("flashinfer") is None:
        pytest.skip("flashinfer is not installed")
    if graph_decoder and (name != "flashinfer" or chunks is PREFILL_STEP):
        pytest.skip("only FlashInfer's decode has a CUDA-graph wrapper")
    host, args = gpu_step(chunks, scales)
    backend = select_backend(name, GPU_CONFIG, torch.bfloat16, torch.device("cuda"), 16, FP8_KV_DTYPE, scales)
    backend.plan(host, len(chunks) if graph_decoder else None)
    reference_cache = args[3].clone()
    expected = TorchBackend(scales).forward(*args[:3], reference_cache, *args[4:])
    got = backend.forward(*args)
    assert torch.equal(args[3].view(torch.uint8), reference_cache.view(torch.uint8))
    torch.testing.assert_close(got.float(), expected.float(), atol=2e-2, rtol=2e-2)


def test_flashinfer_is_refused_with_an_fp8_cache():
    """FlashInfer 0.6's fp8 prefill kernel failed to build (JIT, sm_90) on the H200: selecting it with
    an fp8 cache names the problem and the way out instead of failing at the first prefill."""
    with pytest.raises(ValueError, match="flashinfer.*float8_e4m3fn.*triton"):
        select_backend("flashinfer", GPU_CONFIG, torch.bfloat16, torch.device("cuda"), 16, FP8_KV_DTYPE)
    assert select_backend("auto", GPU_CONFIG, torch.bfloat16, torch.device("cpu"), 16, FP8_KV_DTYPE).name == "torch"
