"""The throughput roofline's counts against a token-by-token count, and `bench throughput` printing it."""

import argparse
import dataclasses
import random

import pytest
import torch

from graphllm.bench import roofline
from graphllm.bench.roofline import keys_attended, schedule_floor, wall_split, workload_roofline
from graphllm.models.config import ModelConfig

CONFIG = ModelConfig(architecture="LlamaForCausalLM", vocab_size=100, hidden_size=64, intermediate_size=128,
                     num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                     rms_norm_eps=1e-5, max_position_embeddings=512)
WEIGHTS = {"decode_read_parameters": 10_000, "lm_head_parameters": 2_000}


def counted(requests, config, kv_per_token):
    """The same floor, token by token: every processed token's matmuls and keys, every decode token's reads."""
    flop = kv = 0
    for prompt, generated in requests:
        for pos in range(prompt + generated - 1):  # the tokens that run through the model
            flop += 2 * (WEIGHTS["decode_read_parameters"] - WEIGHTS["lm_head_parameters"])
            kv += kv_per_token  # its K/V written once
            for layer in range(config.num_hidden_layers):
                window = config.window_of(layer)
                keys = pos + 1 if window <= 0 else min(pos + 1, window)
                flop += 2 * 2 * config.num_attention_heads * config.head_dim * keys
                if pos >= prompt:  # a decode token reads its context
                    kv += kv_per_token / config.num_hidden_layers * keys
            if pos == prompt - 1 or pos >= prompt:
                flop += 2 * WEIGHTS["lm_head_parameters"]  # a sampled token
        kv += kv_per_token * prompt  # the prefill reads its prompt's keys once (the last generated token never runs)
    return flop, kv


@pytest.mark.parametrize("config", [CONFIG, dataclasses.replace(CONFIG, sliding_window=7),
                                    dataclasses.replace(CONFIG, sliding_window=5, layer_types=(
                                        "sliding_attention", "full_attention", "sliding_attention"))],
                         ids=["full", "window", "alternating"])
def test_roofline_counts_match_a_token_by_token_count(config):
    rng = random.Random(0)
    requests = [(rng.randint(1, 20), rng.randint(1, 20)) for _ in range(12)]
    r = workload_roofline(requests, WEIGHTS, config, kv_bytes_per_token=96.0, gemm_tflops=2.0, bandwidth_tbs=0.5)
    flop, kv = counted(requests, config, 96.0)
    assert r["matmul_flop"] + r["attention_flop"] == pytest.approx(flop)
    assert r["kv_bytes"] == pytest.approx(kv)
    assert r["output_tokens"] == sum(g for _, g in requests)
    assert r["floor_s"] == pytest.approx(flop / 2e12 + kv / 0.5e12)
    assert r["output_tok_s"] == pytest.approx(r["output_tokens"] / r["floor_s"])


def test_roofline_without_ceilings_counts_but_sets_no_floor():
    r = workload_roofline([(4, 3)], WEIGHTS, CONFIG, 96.0, gemm_tflops=None, bandwidth_tbs=0.5)
    assert r["matmul_flop"] > 0 and r["floor_s"] is None and r["output_tok_s"] is None


def test_keys_attended_closed_form():
    for length in range(0, 30):
        for window in (0, 1, 4, 9, 40):
            assert keys_attended(length, window) == sum(p + 1 if window <= 0 else min(p + 1, window)
                                                        for p in range(length))


def test_wall_split_adds_the_steps_of_each_phase():
    split = wall_split({"prefill": {"steps": 4, "total_ms": 25.0}, "decode": {"steps": 10, "total_ms": 5.0}}, 0.2)
    assert split["prefill"] == {"steps": 4, "seconds": 0.1, "share": pytest.approx(0.5), "source": "host"}
    assert split["decode"]["seconds"] == pytest.approx(0.05) and split["decode"]["share"] == pytest.approx(0.25)


def test_wall_split_takes_the_gpu_timeline_where_it_was_timed():
    """Under async scheduling a step's host total holds the step before's GPU time: the events' spans decide."""
    split = wall_split({"prefill": {"steps": 4, "total_ms": 5.0, "gpu_ms": 25.0},
                        "decode": {"steps": 10, "total_ms": 15.0, "gpu_ms": 5.0}}, 0.2)
    assert split["prefill"] == {"steps": 4, "seconds": 0.1, "share": pytest.approx(0.5), "source": "gpu"}
    assert split["decode"]["seconds"] == pytest.approx(0.05) and split["decode"]["source"] == "gpu"


def test_schedule_floor_takes_each_steps_matmuls_or_weight_read_plus_its_kv():
    """Two steps at 1 TFLOP/s and 1 TB/s, 12,000 bytes of weights (12 ns a read): a prefill of 100 tokens (matmul
    2 x 8,000 x 100 FLOP = 1.6 us > the read) and a decode of 2 sequences (matmul 2 x (8,000 x 2 + 2,000 x 2) FLOP
    = 40 ns > 12 ns); then weights so heavy that each step is its weight read."""
    weights = {**WEIGHTS, "decode_read_bytes": 12_000}
    table = {"seqs": [1, 2], "prefill_tokens": [100, 0], "decode_seqs": [0, 2], "new_tokens": [100, 2],
             "context_tokens": [100, 210]}
    floor = schedule_floor(table, weights, CONFIG, 10.0, gemm_tflops=1.0, bandwidth_tbs=1.0)
    prefill_mm, decode_mm = 2 * 8_000 * 100 / 1e12, 2 * (8_000 * 2 + 2_000 * 2) / 1e12
    prefill_kv, decode_kv = 10.0 * (100 + 100) / 1e12, 10.0 * (210 + 2) / 1e12
    matmul, kv = prefill_mm + decode_mm, prefill_kv + decode_kv
    phases = floor.pop("phases")
    assert floor == {"steps": 2, "matmul_or_weights_s": pytest.approx(matmul), "kv_s": pytest.approx(kv),
                     "floor_s": pytest.approx(matmul + kv)}
    assert phases == {"prefill": {"steps": 1, "matmul_or_weights_s": pytest.approx(prefill_mm),
                                  "kv_s": pytest.approx(prefill_kv), "floor_s": pytest.approx(prefill_mm + prefill_kv)},
                      "decode": {"steps": 1, "matmul_or_weights_s": pytest.approx(decode_mm),
                                 "kv_s": pytest.approx(decode_kv), "floor_s": pytest.approx(decode_mm + decode_kv)}}
    heavy = {**WEIGHTS, "decode_read_bytes": 10**9}  # 1 ms a read: each step is its weight read
    assert schedule_floor(table, heavy, CONFIG, 10.0, 1.0, 1.0)["matmul_or_weights_s"] == pytest.approx(2e-3)
    assert schedule_floor(table, weights, CONFIG, 10.0, None, 1.0) is None
    assert schedule_floor(table, weights, dataclasses.replace(CONFIG, sliding_window=7), 10.0, 1.0, 1.0) is None


def test_ceilings_take_the_matmul_rate_of_the_scheme(monkeypatch):
    """fp8 W8A8 sets its roofline at the float8 matmul rate (it was set at bf16's, so an fp8 run's share of it
    was overstated); the weight-only schemes and bf16 at the model dtype's; --gemm-tflops over either."""
    monkeypatch.setattr(roofline, "measure_bandwidth_tbs", lambda device: 4.0)
    monkeypatch.setattr(roofline, "measure_gemm_tflops", lambda device, dtype: 700.0)
    monkeypatch.setattr(roofline, "measure_fp8_gemm_tflops", lambda device: 1300.0)
    cuda = torch.device("cuda")  # a device object only: nothing runs on it here

    def rate(**flags):
        args = argparse.Namespace(**{"bandwidth_tbs": None, "gemm_tflops": None, **flags})
        return roofline.device_ceilings(args, cuda, torch.bfloat16)["gemm_tflops"]
    assert rate(quantization="fp8") == 1300.0
    assert rate(quantization="int4") == rate(quantization=None) == rate() == 700.0
    assert rate(quantization="fp8", gemm_tflops=900.0) == 900.0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA device")
def test_fp8_matmul_rate_is_measured_on_the_gpu():
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("float8 matmuls need sm_89+")
    assert 0 < roofline.measure_fp8_gemm_tflops(torch.device("cuda"), n=1024, reps=2) < float("inf")
