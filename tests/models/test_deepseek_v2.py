"""DeepSeek-V2 (models/deepseek_v2.py, models/mla.py): the latent KV cache's size at V2-Lite's published shape, the
absorbed MLA op against attention over decompressed per-head K/V through a paged cache (prefill, a chunk, decode
steps), what is refused by name, and int8 quantization of the MLA projections. Greedy parity with transformers
(eager and compiled) is tests/test_parity.py's, for the tiny "deepseek_v2" and "deepseek_v2-qlora" configs."""

import dataclasses
import importlib.util

import pytest
import torch

import graphllm.backends.selection as selection
from graphllm.backends import AttentionShape, TorchBackend, select_backend
from graphllm.bench.presets import PRESETS
from graphllm.models.registry import resolve_architecture
from graphllm.ops.attention import use_backend
from graphllm.passes.parallel.shard_tp import ShardTP
from graphllm.runtime.kv_cache import allocate_kv_caches, kv_bytes_per_block
import graphllm.ops.mla_attention  # noqa: F401

V2_LITE = PRESETS["deepseek-v2-lite"]


def test_latent_cache_bytes_per_token_at_v2_lite_shape():
    _, config = resolve_architecture(V2_LITE)
    standard = dataclasses.replace(config, kv_lora_rank=0)  # the same heads with per-head K and V cached
    mla, full = (kv_bytes_per_block(c, 16, torch.bfloat16) for c in (config, standard))
    expected = (config.kv_lora_rank + config.qk_rope_head_dim) / (2 * config.num_attention_heads * config.head_dim)
    assert (config.kv_lora_rank, config.qk_rope_head_dim, config.num_attention_heads, config.head_dim) == (512, 64, 16, 192)
    assert mla / full == pytest.approx(expected) and mla / full <= 1 / 8  # 576 / 6144 = 0.09375
    assert mla == 16 * 576 * 27 * 2  # block_size * (latent + rope key) * layers * bf16
    caches = allocate_kv_caches(config, 3, 16, torch.bfloat16, torch.device("meta"))
    assert len(caches) == 27 and caches[0].shape == (1, 3, 16, 1, 576)


def _decompressed_attention(q_nope, q_pe, c_kv, k_pe, w_uk, w_uv, scale):
    """Straightforward MLA: per-head keys [c_kv @ W_uk.T, k_pe] and values c_kv @ W_uv.T, causal. -> [S, H, v]."""
    keys = torch.cat((torch.einsum("sl,hnl->shn", c_kv, w_uk), k_pe[:, None].expand(-1, q_nope.shape[1], -1)), -1)
    values = torch.einsum("sl,hvl->shv", c_kv, w_uv)
    scores = torch.einsum("thd,shd->hts", torch.cat((q_nope, q_pe), -1), keys) * scale
    causal = torch.ones(len(c_kv), len(c_kv), dtype=torch.bool).tril()
    return torch.einsum("hts,shv->thv", scores.masked_fill(~causal, float("-inf")).softmax(-1), values)


@pytest.mark.parametrize("steps", [(9,), (4, 3, 1, 1)], ids=["prefill", "chunk-then-decode"])
def test_absorbed_op_matches_decompressed_attention(steps):
    heads, nope, rope, v_dim, rank, block = 3, 8, 4, 6, 10, 4
    gen = torch.Generator().manual_seed(0)
    rand = lambda *shape: torch.randn(*shape, generator=gen)  # noqa: E731
    total = sum(steps)
    q_nope, q_pe, c_kv, k_pe = rand(total, heads, nope), rand(total, heads, rope), rand(total, rank), rand(total, rope)
    w_uk, w_uv = rand(heads, nope, rank), rand(heads, v_dim, rank)
    scale = 0.3
    cache = torch.zeros(1, 8, block, 1, rank + rope)
    table = torch.tensor([[5, 2, 7]])  # non-contiguous blocks
    outs, start = [], 0
    for n in steps:
        pos = torch.arange(start, start + n)
        slots = table[0, pos // block] * block + pos % block
        q = torch.cat((torch.einsum("thn,hnl->thl", q_nope[pos], w_uk), q_pe[pos]), -1)
        with use_backend(TorchBackend()):
            latent = torch.ops.graphllm.mla_attention(q, torch.cat((c_kv[pos], k_pe[pos]), -1), cache, pos, slots,
                                                      table, torch.tensor([start + n]), torch.tensor([0, n]), scale,
                                                      rank)
        outs.append(torch.einsum("thl,hvl->thv", latent, w_uv))
        start += n
    want = _decompressed_attention(q_nope, q_pe, c_kv, k_pe, w_uk, w_uv, scale)
    torch.testing.assert_close(torch.cat(outs), want, atol=1e-5, rtol=1e-4)  # the reference runs float32
    torch.testing.assert_close(cache[0, 5].flatten(0, 1)[:block, :rank], c_kv[:block])  # the latent, cached once


@pytest.mark.parametrize("field, value, words", [
    ("topk_method", "group_limited_greedy", "topk_method='group_limited_greedy'"),
    ("topk_method", "noaux_tc", "topk_method='noaux_tc'"),
    ("scoring_func", "sigmoid", "scoring_func='sigmoid'"),
    ("norm_topk_prob", True, "norm_topk_prob"),
    ("rope_scaling", {"type": "dynamic", "factor": 2.0}, "rope type 'dynamic'"),
    ("rope_scaling", {"type": "yarn", "factor": 40, "attention_factor": 0.5, "original_max_position_embeddings": 4096},
     "attention_factor"),
    ("quantization_config", {"quant_method": "fp8"}, "pre-quantized"),
])
def test_refuses_what_it_does_not_implement(field, value, words):
    with pytest.raises(ValueError, match=words):
        resolve_architecture({**V2_LITE, field: value})


def test_backends_and_tensor_parallelism_refuse_mla(monkeypatch):
    _, config = resolve_architecture(V2_LITE)
    shape = AttentionShape(16, 16, 192, mla=True)
    cpu = torch.device("cpu")
    with pytest.raises(ValueError, match="'flashinfer' does not run multi-head latent attention"):
        select_backend("flashinfer", shape, torch.bfloat16, cpu, 16)
    for name in ("auto", "triton"):
        with pytest.raises(ValueError, match="float8 KV cache"):
            select_backend(name, shape, torch.bfloat16, cpu, 16, torch.float8_e4m3fn)
    if importlib.util.find_spec("triton") is not None:  # triton runs MLA: on CUDA, or on CPU under its interpreter
        monkeypatch.setattr(selection, "_triton_interprets", lambda: False)
        with pytest.raises(ValueError, match="'triton' is unavailable: .* CUDA device"):
            select_backend("triton", shape, torch.bfloat16, cpu, 16)
        monkeypatch.setattr(selection, "_triton_interprets", lambda: True)
        assert select_backend("triton", shape, torch.bfloat16, cpu, 16).name == "triton"
    assert isinstance(select_backend("auto", shape, torch.bfloat16, cpu, 16), TorchBackend)
    with pytest.raises(ValueError, match="multi-head latent attention"):
        ShardTP.for_model(config, 0, 2, "0")


def test_int8_quantizes_the_mla_linears():
    from graphllm.passes.quantization.quantize_int8 import QuantizeInt8
    from tests.passes.harness import logits_relative_error, run_pass
    before, after, counts, _, ops_after, config = run_pass(QuantizeInt8(), "deepseek_v2")
    # per layer: q_proj, kv_a_proj_with_mqa, o_proj (kv_b_proj is absorbed: read as a weight, stays float);
    # layer 0 the dense MLP's 3, layer 1 the shared experts' 3 (the router is kept out by name)
    assert counts == {"quantized": 6 * config.num_hidden_layers, "kept": 0}
    assert ops_after["mla_attention.default"] == config.num_hidden_layers
    assert 1e-5 < logits_relative_error(before, after, config) < 0.05
