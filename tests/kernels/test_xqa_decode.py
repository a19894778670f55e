"""The triton backend's decode through TensorRT-LLM's XQA kernel (EngineConfig.xqa_decode, flashinfer.xqa) gives the
split kernel's output over bf16 and float8 caches (unequal k and v scales, which XQA takes as one kv_scale and a
q_scale); where it cannot run, the engine refuses the switch and says why."""

import importlib.util

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

from graphllm import Engine  # noqa: E402
from graphllm.backends import AttentionShape, HostMeta, xqa_supports  # noqa: E402
from graphllm.backends.triton_backend import TritonBackend  # noqa: E402
from graphllm.kernels.kv_quant import KVScales  # noqa: E402
from tests.kernels.conftest import DEVICE, ON_GPU, make_paged_kv, randn  # noqa: E402

FP8 = torch.float8_e4m3fn
XQA_GPU = (ON_GPU and torch.cuda.get_device_capability() >= (9, 0)
           and importlib.util.find_spec("flashinfer") is not None)


def test_xqa_supports_names_what_is_missing():
    shape = AttentionShape(32, 8, 128)
    assert "triton backend's decode" in xqa_supports("flashinfer", shape, torch.device("cpu"))
    assert "latent attention" in xqa_supports("triton", AttentionShape(16, 16, 192, mla=True), torch.device("cpu"))
    assert "compute capability 9.0" in xqa_supports("triton", shape, torch.device("cpu"))


def test_the_engine_refuses_xqa_decode_where_it_cannot_run(tiny_model_dir):
    path, _ = tiny_model_dir("llama")
    with pytest.raises(ValueError, match="xqa_decode is unavailable: .*attention backend is 'torch'"):
        Engine.from_pretrained(path, compile=False, device="cpu", xqa_decode=True)


@pytest.mark.skipif(not XQA_GPU, reason="flashinfer.xqa needs a GPU of compute capability 9.0+ and flashinfer")
@pytest.mark.parametrize("cache", ["bf16", "fp8"])
def test_xqa_decode_gives_the_split_kernels_output(cache, monkeypatch):
    seq_lens, heads, kv_heads, dim, block_size = [1, 17, 300, 64, 1000, 33], 32, 8, 128, 16
    kv_cache, tables = make_paged_kv(seq_lens, block_size, kv_heads, dim, torch.bfloat16, seed=3)
    kv_cache = kv_cache.nan_to_num(0.0)  # an engine's cache is zeroed: XQA reads a last page's tail
    scales = KVScales(0.5, 2.0)
    if cache == "fp8":
        kv_cache = torch.stack([kv_cache[0] / scales.k, kv_cache[1] / scales.v]).to(FP8)
    batch = len(seq_lens)
    q = randn((batch, heads, dim), torch.bfloat16, seed=4)
    k, v = (randn((batch, kv_heads, dim), torch.bfloat16, seed=s) for s in (5, 6))
    lens = torch.tensor(seq_lens, device=DEVICE)
    last = lens - 1
    slots = tables.gather(1, (last // block_size)[:, None])[:, 0] * block_size + last % block_size
    starts = torch.arange(batch + 1, device=DEVICE)
    host = HostMeta(np.arange(batch + 1), np.array(seq_lens), tables.cpu().numpy())
    xqa_module = importlib.import_module("flashinfer.xqa")  # the package's attribute `xqa` is the function
    calls, real = [], xqa_module.xqa
    outs = []
    for xqa in (False, True):
        monkeypatch.setattr(xqa_module, "xqa", lambda *a, **kw: calls.append(xqa) or real(*a, **kw))
        backend = TritonBackend(scales)
        backend.xqa_decode = xqa
        backend.plan(host)
        cache_copy = kv_cache.clone()
        outs.append(backend.forward(q, k, v, cache_copy, last, slots, tables, lens, starts, dim ** -0.5, 0))
        torch.cuda.synchronize()
    expected, got = (o.float() for o in outs)
    assert calls == [True]  # the pass with the switch ran XQA, once; the other did not
    err = ((got - expected).abs().max() / expected.abs().max()).item()
    print(f"xqa_decode {cache}: max error {err:.4f} of the output's largest value")
    assert err < (0.06 if cache == "fp8" else 0.01)
