"""The triton backend's decode through TensorRT-LLM's XQA kernel (EngineConfig.xqa_decode, flashinfer.xqa) takes the
float8 cache's launches where the split kernel rounds q to float8, and gives its output there (unequal k and v
scales, which XQA takes as one kv_scale and a q_scale); where it cannot run, the engine refuses the switch and says
why."""

import importlib.util

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

from graphllm import Engine  # noqa: E402
from graphllm.backends import AttentionShape, HostMeta, xqa_supports  # noqa: E402
from graphllm.backends.triton_backend import TritonBackend  # noqa: E402
from graphllm.kernels.kv_quant import KVScales  # noqa: E402
from graphllm.kernels.paged_decode_attention import FP8_HALVES_PROGRAMS, decode_tiling, rounds_q_to_fp8  # noqa: E402
from tests.kernels.conftest import DEVICE, ON_GPU, make_paged_kv, randn  # noqa: E402

FP8 = torch.float8_e4m3fn
XQA_GPU = (ON_GPU and torch.cuda.get_device_capability() >= (9, 0)
           and importlib.util.find_spec("flashinfer") is not None)


def test_xqa_supports_names_what_is_missing():
    shape, fp8, bf16 = AttentionShape(32, 8, 128), FP8, torch.bfloat16
    assert "triton backend's decode" in xqa_supports("flashinfer", shape, torch.device("cpu"), fp8)
    assert "latent attention" in xqa_supports("triton", AttentionShape(16, 16, 192, mla=True), torch.device("cpu"),
                                              fp8)
    # where graphllm's kernel never rounds q to float8, the switch would change nothing: refused, not ignored
    assert "--kv-cache-dtype fp8" in xqa_supports("triton", shape, torch.device("cpu"), bf16)
    assert "128-wide heads" in xqa_supports("triton", AttentionShape(32, 8, 64), torch.device("cpu"), fp8)
    assert "compute capability 9.0" in xqa_supports("triton", shape, torch.device("cpu"), fp8)


def test_the_engine_refuses_xqa_decode_where_it_cannot_run(tiny_model_dir):
    path, _ = tiny_model_dir("llama")
    with pytest.raises(ValueError, match="xqa_decode is unavailable: .*attention backend is 'torch'"):
        Engine.from_pretrained(path, compile=False, device="cpu", xqa_decode=True)
    with pytest.raises(ValueError, match="xqa_mixed sends a mixed step's decodes through XQA decode, which does not "
                                         "run here"):  # --xqa-mixed is not silently dropped where XQA is off
        Engine.from_pretrained(path, compile=False, device="cpu", xqa_mixed=True)


def test_xqa_decode_is_on_by_default_only_where_it_runs_and_builds(monkeypatch, caplog):
    """EngineConfig.xqa_decode: None (the default) takes XQA wherever xqa_supports allows it and the kernel builds
    (TritonBackend.probe_xqa); a failed build keeps the split kernel with a warning naming why, where True refuses
    by name; False never tries."""
    from graphllm.runtime import setup

    shape, device = AttentionShape(32, 8, 128), torch.device("cpu")
    assert not setup.resolve_xqa_decode(None, TritonBackend(), shape, device, FP8, torch.bfloat16, 16)  # cannot run
    monkeypatch.setattr(setup, "xqa_supports", lambda *a: None)  # as on an H100 or H200 with flashinfer
    if not XQA_GPU:  # here the real probe fails as a machine without flashinfer's XQA would
        with caplog.at_level("WARNING"):
            assert not setup.resolve_xqa_decode(None, TritonBackend(), shape, device, FP8, torch.bfloat16, 16)
        assert "flashinfer.xqa did not build or run here" in caplog.text
        with pytest.raises(ValueError, match="xqa_decode is unavailable: flashinfer.xqa did not build or run here"):
            setup.resolve_xqa_decode(True, TritonBackend(), shape, device, FP8, torch.bfloat16, 16)
    probed = []
    monkeypatch.setattr(TritonBackend, "probe_xqa", lambda self, *a: probed.append(a) and None)
    assert setup.resolve_xqa_decode(None, TritonBackend(), shape, device, FP8, torch.bfloat16, 16)
    assert probed == [(32, 8, 128, 16, torch.bfloat16, device)]
    assert not setup.resolve_xqa_decode(False, TritonBackend(), shape, device, FP8, torch.bfloat16, 16)
    assert len(probed) == 1  # --no-xqa-decode does not try
    assert not setup.resolve_xqa_decode(None, TritonBackend(), shape, device, FP8, torch.bfloat16, 8)
    with pytest.raises(ValueError, match="xqa_decode is unavailable: its pages are 16, 32, 64, 128 tokens, not "
                                         "--block-size 8"):
        setup.resolve_xqa_decode(True, TritonBackend(), shape, device, FP8, torch.bfloat16, 8)
    assert len(probed) == 1  # nor does a block size XQA has no kernel for
    assert not setup.resolve_xqa_decode(None, TritonBackend(), shape, device, FP8, torch.float32, 16)
    with pytest.raises(ValueError, match="its queries are bfloat16 or float16, not torch.float32"):
        setup.resolve_xqa_decode(True, TritonBackend(), shape, device, FP8, torch.float32, 16)
    assert len(probed) == 1  # nor a float32 model


def test_xqa_takes_no_launch_past_its_semaphores(monkeypatch):
    """On by default, XQA must not fail a step that is larger than its semaphores cover (XQA_MAX_SEQ_HEADS sequence x
    KV-head pairs): the split kernel takes that launch."""
    import graphllm.backends.triton_backend as triton_backend

    monkeypatch.setattr(triton_backend, "rounds_q_to_fp8", lambda dim, programs, device: True)  # as on sm_90
    backend = TritonBackend()
    backend.xqa_decode = True
    cache = torch.empty(2, 1, 16, 8, 128, dtype=FP8)  # [K/V, blocks, block size, 8 KV heads, D]
    fits = triton_backend.XQA_MAX_SEQ_HEADS // 8
    assert backend._runs_xqa(torch.empty(1, 32, 128).expand(fits, 32, 128), cache, 0.0, 0)
    assert not backend._runs_xqa(torch.empty(1, 32, 128).expand(fits + 1, 32, 128), cache, 0.0, 0)
    assert not backend._runs_xqa(torch.empty(1, 32, 128).expand(fits, 32, 128), cache, 30.0, 0)  # a soft cap


def test_a_mixed_steps_decodes_through_xqa_leave_the_prefill_kernel_the_rest(monkeypatch):
    """xqa_mixed: XQA takes every sequence of a mixed step with the q row of its first new token; the one-token rows'
    outputs land on their rows, the others' on a spare row, and the prefill kernel writes the prompts' and chunks'
    rows. Here XQA is stood in for by its function (the float32 decode oracle): the step's output is the prefill
    oracle's, over a float8 cache with unequal scales, with padding sequences of no tokens at the end."""
    import graphllm.backends.triton_backend as triton_backend
    from graphllm.kernels.paged_decode_attention import paged_decode_attention_reference
    from graphllm.kernels.paged_prefill_attention import paged_prefill_attention_reference
    from tests.kernels.conftest import assert_close

    monkeypatch.setattr(triton_backend, "rounds_q_to_fp8", lambda dim, programs, device: True)  # as on sm_90
    launches = []

    def xqa_function(self, q, kv_cache, block_tables, seq_lens, scale):
        launches.append(q.shape[0])
        return paged_decode_attention_reference(q, kv_cache[0], kv_cache[1], block_tables, seq_lens, scale, 0,
                                                kv_scales=self.scales_for(kv_cache))

    monkeypatch.setattr(TritonBackend, "_xqa", xqa_function)
    # (cached, new): a prompt, a chunk over a prefix, decodes, one with no new token, a mixed graph's padding
    chunks = [(0, 40), (37, 20), (99, 1), (0, 1), (5, 0), (20, 1), (0, 0), (0, 0)]
    heads, kv_heads, dim, block_size, scales = 8, 2, 64, 8, KVScales(0.37, 1.9)
    seq_lens = [cached + new for cached, new in chunks]
    kv_cache, tables = make_paged_kv(seq_lens, block_size, kv_heads, dim, torch.float32, seed=0)
    kv_cache = torch.stack([kv_cache[0] / scales.k, kv_cache[1] / scales.v]).to(FP8)
    starts = torch.tensor([0] + [new for _, new in chunks]).cumsum(0).to(DEVICE)
    q = randn((int(starts[-1]), heads, dim), torch.float32, seed=1)
    lens = torch.tensor(seq_lens, device=DEVICE)
    backend = TritonBackend(scales)
    backend.xqa_decode = backend.xqa_mixed = True
    backend.xqa_mixed_min_seqs = 1  # the engine's: DECODE_KERNEL_MIN_SEQS sequences
    got = backend._attend(q, kv_cache, tables, lens, starts, dim ** -0.5, 0, 0.0)
    assert launches == [len(chunks)] and got.shape == q.shape
    assert_close(got, paged_prefill_attention_reference(q, kv_cache[0], kv_cache[1], tables, lens, starts,
                                                        dim ** -0.5, 0, kv_scales=scales))
    backend.xqa_mixed_min_seqs = len(chunks) + 1  # fewer sequences: the prefill kernel alone
    assert_close(backend._attend(q, kv_cache, tables, lens, starts, dim ** -0.5, 0, 0.0), got)
    assert launches == [len(chunks)]


def test_the_split_kernel_rounds_q_from_enough_programs_only():
    """The rule --xqa-decode follows (TritonBackend._runs_xqa): decode_tiling's fp8_qk, which needs 128-wide heads
    and FP8_HALVES_PROGRAMS (sequence, KV head) programs; never off sm_90."""
    assert decode_tiling(128, True, False, FP8_HALVES_PROGRAMS, fp8_mma=True).fp8_qk
    assert not decode_tiling(128, True, False, FP8_HALVES_PROGRAMS - 1, fp8_mma=True).fp8_qk
    assert not decode_tiling(64, True, False, 4 * FP8_HALVES_PROGRAMS, fp8_mma=True).fp8_qk
    assert not decode_tiling(128, False, False, 4 * FP8_HALVES_PROGRAMS, fp8_mma=True).fp8_qk
    assert not rounds_q_to_fp8(128, 4 * FP8_HALVES_PROGRAMS, torch.device("cpu"))


def decode_once(seq_lens: list[int], cache: str, xqa: bool, calls: list) -> torch.Tensor:
    """One decode step of 8B heads through TritonBackend over a random paged cache (unequal k and v scales)."""
    heads, kv_heads, dim, block_size = 32, 8, 128, 16
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
    backend = TritonBackend(scales)
    backend.xqa_decode = xqa
    backend.plan(host)
    before = len(calls)
    out = backend.forward(q, k, v, kv_cache, last, slots, tables, lens, starts, dim ** -0.5, 0)
    torch.cuda.synchronize()
    return out.float(), len(calls) > before


@pytest.mark.skipif(not XQA_GPU, reason="flashinfer.xqa needs a GPU of compute capability 9.0+ and flashinfer")
def test_xqa_decode_takes_the_launches_where_the_split_kernel_rounds_q(monkeypatch):
    """Over a float8 cache read by 40 sequences x 8 KV heads (320 programs: the split kernel rounds q to float8),
    XQA runs and gives the split kernel's output; 6 sequences (48 programs), or a bf16 cache, keep the split
    kernel with the switch on."""
    xqa_module = importlib.import_module("flashinfer.xqa")  # the package's attribute `xqa` is the function
    calls, real = [], xqa_module.xqa
    monkeypatch.setattr(xqa_module, "xqa", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    many = [1, 17, 300, 64, 1000, 33, 16, 15, 129, 500] * 4
    expected, ran = decode_once(many, "fp8", False, calls)
    assert not ran
    got, ran = decode_once(many, "fp8", True, calls)
    assert ran
    err = ((got - expected).abs().max() / expected.abs().max()).item()
    print(f"xqa_decode fp8, {len(many)} sequences: max error {err:.4f} of the output's largest value")
    assert err < 0.06
    for seq_lens, cache in ((many[:6], "fp8"), (many, "bf16")):
        _, ran = decode_once(seq_lens, cache, True, calls)
        assert not ran, (len(seq_lens), cache)


@pytest.mark.skipif(not XQA_GPU, reason="flashinfer.xqa needs a GPU of compute capability 9.0+ and flashinfer")
def test_xqa_takes_a_mixed_steps_decodes_as_the_split_kernels_launch_does(monkeypatch):
    """xqa_mixed on the GPU: a mixed step of 2 prompts and 130 decodes over a float8 cache (8B heads; the split
    kernel's own launch of the decodes rounds q to float8 there too) gives the split kernel's output, with one XQA
    launch."""
    xqa_module = importlib.import_module("flashinfer.xqa")
    calls, real = [], xqa_module.xqa
    monkeypatch.setattr(xqa_module, "xqa", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    chunks = [(0, 300), (500, 64)] + [(n, 1) for n in ([16, 299, 63, 999, 32, 128] * 22)[:130]]
    heads, kv_heads, dim, block_size, scales = 32, 8, 128, 16, KVScales(0.5, 2.0)
    seq_lens = [cached + new for cached, new in chunks]
    kv_cache, tables = make_paged_kv(seq_lens, block_size, kv_heads, dim, torch.bfloat16, seed=3)
    kv_cache = kv_cache.nan_to_num(0.0)  # an engine's cache is zeroed: XQA reads a last page's tail
    kv_cache = torch.stack([kv_cache[0] / scales.k, kv_cache[1] / scales.v]).to(FP8)
    starts = torch.tensor([0] + [new for _, new in chunks]).cumsum(0)
    q = randn((int(starts[-1]), heads, dim), torch.bfloat16, seed=4)
    lens = torch.tensor(seq_lens, device=DEVICE)
    backend = TritonBackend(scales)
    backend.xqa_decode = True
    backend.plan(HostMeta(starts.numpy(), np.array(seq_lens), tables.cpu().numpy()))
    starts = starts.to(DEVICE)
    expected = backend._attend(q, kv_cache, tables, lens, starts, dim ** -0.5, 0, 0.0).float()
    assert not calls
    backend.xqa_mixed = True
    got = backend._attend(q, kv_cache, tables, lens, starts, dim ** -0.5, 0, 0.0).float()
    torch.cuda.synchronize()
    assert len(calls) == 1
    err = ((got - expected).abs().max() / expected.abs().max()).item()
    print(f"xqa_mixed: {len(chunks)} sequences, max error {err:.4f} of the output's largest value")
    assert err < 0.06
