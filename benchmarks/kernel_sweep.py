"""GPU microbenchmarks of graphllm's decode kernels at the Llama-3-8B shapes (H200 runs).

    python benchmarks/kernel_sweep.py OUT.json [matmul] [matmul8] [attention] [attention-gemma] [mixed] [prefill]
        [prologue] [prologue-FAMILY] [chain] [epilogue]

matmul: skinny_matmul against cuBLAS (F.linear) for each projection at M = 1, 8, 16, over a grid
of tile configs (the best and default_config's are reported), plus cuBLAS at M = 128, 256.
argmax: the greedy sampler's argmax over a 128,256-word vocabulary at batch 1, 8, 256, PyTorch's
against the two-stage argmax_rows.
matmul8: skinny_matmul against cuBLAS for qkv, o_proj, down, gate_up at M = 8, over a grid with
K splits (SPLIT_K 1, 2, 4, 8): default_config's, the best, and the best per SPLIT_K.
attention: paged_decode_attention at batch x context sizes, default splits and forced ones, and
the default splits over a float8_e4m3fn copy of the cache (half the bytes). attention-gemma: Gemma 2's heads
(256 wide, group 2, soft cap 50) at batch 1 and 8, splits x 4 / 8 warps; attention-phi3 the same for Phi-3-mini's
(96 wide, 32 KV heads).
mixed: one-token rows through paged_prefill_attention (as in a mixed step) against the decode kernel.
prefill: what a large prefill step runs, at the 8B shapes: paged_prefill_attention over fresh prompts (8 x 1,024
tokens as the throughput run's first steps, 2 x 2,048, 16 x 512) at 4 and 8 warps, in TFLOP/s of its causal
FLOPs; cuBLAS for each projection at 8,192 rows in TFLOP/s; and SwiGLU at 8,192 rows in TB/s.
prologue: each decode linear with the op before it (add_rms_norm, silu_mul or none) as the engine ran it
before linear_prologue (row kernel, then graphllm.linear's routing), and cuBLAS alone on the operand (the
routing follows skinny_matmul.CONFIGS since 2026-11-29), against one skinny_matmul launch
with that prologue, default config and the best of a grid with K splits, at M = 1, 8, 16; prologue-FAMILY: the
same at one row for a family preset's shapes (FAMILY_SHAPES: gemma, phi3, olmo2, qwen3moe).
chain: CHAIN_LAYERS decoder layers' linears back to back (norm, qkv, o_proj, norm, gate_up, SwiGLU,
down, each on its own weights), unfused and through the fused ops: what the kernel boundaries
cost inside a graph. (The run of 2026-11-21 also tried programmatic dependent launch, with and
without an L2 weight prefetch before gdc_wait: no gain without the prefetch, slower with it;
results/2026-11-21-h200-kernel-sweep-chain.json.)

epilogue: the MLP's SwiGLU at 1, 2 and 8 rows (8B and Phi-3-mini shapes, under PDL as the engine runs):
gate_up alone as the engine runs it and through matmul_act_mul over an interleaved weight (default and a small
grid of tiles), and the MLP (gate_up, SwiGLU, down) four ways: the two products with silu_and_mul's row kernel
between them, SwiGLU in down's prologue (one row), the halves epilogue (--linear-epilogue) and the interleaved
epilogue.

Every timing replays a CUDA graph (no launch overhead, as in decode) of calls over several
distinct weight / KV copies, together larger than the L2 cache, so each call streams from HBM.
Bandwidth = bytes each call must read / its time.
"""

import itertools
import json
import sys

import torch
import torch.nn.functional as F
import triton

from graphllm.kernels.fp8_convert import FP8_TRITON
from graphllm.kernels.paged_decode_attention import default_num_splits, paged_decode_attention
from graphllm.kernels.paged_prefill_attention import paged_prefill_attention
from graphllm.kernels.rms_norm import rms_norm
from graphllm.kernels.rope_decode import NewTokens
from graphllm.kernels.rope_store_kv import rope_store_kv
from graphllm.kernels.silu_and_mul import gelu_tanh_and_mul, silu_and_mul
from graphllm.kernels.launch import programmatic_launch
from graphllm.kernels.skinny_matmul import (default_config, interleave_gate_up, interleaved_config, matmul_act_mul,
                                            rms_norm_matmul, silu_mul_matmul, skinny_matmul)
from graphllm.ops.linear import add_rms_norm_linear, linear, silu_and_mul_linear

SHAPES = {"qkv": (6144, 4096), "o_proj": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
          "lm_head": (128256, 4096)}
STREAM_BYTES = 300e6  # copies of the operands per timing: at least this much, to defeat the 50 MB L2
DTYPE = torch.bfloat16


def graph_seconds(calls: list, reps: int = 20) -> float:
    """Mean seconds of one call, timed over CUDA-graph replays of all calls in sequence."""
    for call in calls:
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / reps / len(calls)


def time_configs(call_for, configs, weights: list, ref: torch.Tensor, label) -> list[tuple[float, dict]]:
    """(seconds per call, config) for each config that fits the GPU; call_for(config) -> call(weight).
    Every config's result is checked against ref (float32) first."""
    timings = []
    for config in configs:
        call = call_for(config)
        try:
            got = call(weights[0])
            torch.cuda.synchronize()
        except Exception as exc:  # out of shared memory / registers for this tile
            if "resources" not in str(exc).lower() and "shared" not in str(exc).lower():
                raise
            continue
        assert (got.float() - ref).abs().max().item() < 0.1, (label, config)
        timings.append((graph_seconds([lambda w=w, c=call: c(w) for w in weights]), config))
    return timings


def streamed_weights(n: int, k: int) -> list[torch.Tensor]:
    """Copies of a random [n, k] weight, together at least STREAM_BYTES (so each call streams from HBM)."""
    copies = max(2, int(STREAM_BYTES // (n * k * 2)) + 1)
    return [torch.randn(n, k, device="cuda", dtype=DTYPE) / k ** 0.5 for _ in range(copies)]


def matmul_configs():
    for bn, bk, warps, stages in itertools.product((16, 32, 64), (128, 256, 512), (4, 8), (3, 4)):
        yield {"BLOCK_N": bn, "BLOCK_K": bk, "num_warps": warps, "num_stages": stages}


def sweep_matmul() -> list[dict]:
    rows = []
    for name, (n, k) in SHAPES.items():
        weights = streamed_weights(n, k)
        nbytes = n * k * 2
        for m in (1, 8, 16, 128, 256):
            x = torch.randn(m, k, device="cuda", dtype=DTYPE)
            cublas = graph_seconds([lambda w=w: F.linear(x, w) for w in weights])
            row = {"shape": name, "m": m, "n": n, "k": k, "cublas_us": cublas * 1e6,
                   "cublas_tb_s": nbytes / cublas / 1e12}
            if m <= 16:
                ref = F.linear(x.float(), weights[0].float())
                default = default_config(m, n, k, x.device)
                timings = time_configs(lambda c: (lambda w: skinny_matmul(x, w, config=c)),
                                       [default, *matmul_configs()], weights, ref, (name, m))
                default_s = timings[0][0]
                best_s, best = min(timings, key=lambda t: t[0])
                row |= {"default_us": default_s * 1e6, "default_tb_s": nbytes / default_s / 1e12,
                        "default_config": default, "best_us": best_s * 1e6, "best_tb_s": nbytes / best_s / 1e12,
                        "best_config": best, "speedup_default": cublas / default_s}
            rows.append(row)
            print(json.dumps(row), flush=True)
        del weights
        torch.cuda.empty_cache()
    return rows


PROLOGUE_OF = {"qkv": "add_rms_norm", "o_proj": "none", "gate_up": "add_rms_norm", "down": "silu_mul",
               "lm_head": "none"}


def prologue_calls(prologue: str, x, residual, norm_w, config=None):
    """(unfused call, fused call) for one weight: what the step ran before, and one launch."""
    if prologue == "add_rms_norm":
        return (lambda w: linear(rms_norm(x, norm_w, 1e-5, residual)[0], w),
                lambda w: rms_norm_matmul(x, norm_w, 1e-5, w, residual=residual, config=config)[0])
    if prologue == "silu_mul":
        return lambda w: linear(silu_and_mul(x), w), lambda w: silu_mul_matmul(x, w, config=config)
    if prologue == "gelu_mul":
        return (lambda w: linear(gelu_tanh_and_mul(x), w),
                lambda w: silu_mul_matmul(x, w, config=config, gelu=True))
    return lambda w: linear(x, w), lambda w: skinny_matmul(x, w, config=config)


def unfused_operand(prologue: str, x, residual, norm_w):
    """The matmul operand the prologue makes (computed once, outside the timing): for cuBLAS's own time."""
    if prologue == "add_rms_norm":
        return rms_norm(x, norm_w, 1e-5, residual)[0]
    if prologue in ("silu_mul", "gelu_mul"):
        return gelu_tanh_and_mul(x) if prologue == "gelu_mul" else silu_and_mul(x)
    return x


def prologue_configs():
    for bn, bk, warps, split in itertools.product((16, 32, 64), (256, 512), (4, 8), (1, 2, 4, 8)):
        yield {"BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": split, "num_warps": warps, "num_stages": 4}


def matmul8_configs(k: int):
    """The grid of matmul8, less K splits the kernel would shrink (no empty splits): duplicates."""
    for bn, bk, warps, split in itertools.product((16, 32, 64), (128, 256), (4,), (1, 2, 4, 8)):
        k_split = triton.cdiv(triton.cdiv(k, split), bk) * bk
        if triton.cdiv(k, k_split) == split:
            yield {"BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": split, "num_warps": warps, "num_stages": 4}


def sweep_matmul8() -> list[dict]:
    rows, m = [], 8
    for name in ("qkv", "o_proj", "down", "gate_up"):
        n, k = SHAPES[name]
        weights = streamed_weights(n, k)
        nbytes = n * k * 2
        x = torch.randn(m, k, device="cuda", dtype=DTYPE)
        cublas = graph_seconds([lambda w=w: F.linear(x, w) for w in weights])
        ref = F.linear(x.float(), weights[0].float())
        default = default_config(m, n, k, x.device)
        timings = time_configs(lambda c: (lambda w: skinny_matmul(x, w, config=c)),
                               [default, *matmul8_configs(k)], weights, ref, (name, m))
        best_s, best = min(timings, key=lambda t: t[0])
        by_split = {}
        for t, c in timings[1:]:
            split = c["SPLIT_K"]
            by_split[split] = min(by_split.get(split, t * 1e6), t * 1e6)
        row = {"shape": name, "m": m, "n": n, "k": k, "cublas_us": cublas * 1e6, "cublas_tb_s": nbytes / cublas / 1e12,
               "default_us": timings[0][0] * 1e6, "default_config": default, "best_us": best_s * 1e6,
               "best_tb_s": nbytes / best_s / 1e12, "best_config": best, "best_us_by_split_k": by_split,
               "speedup_best": cublas / best_s}
        rows.append(row)
        print(json.dumps(row), flush=True)
        del weights
        torch.cuda.empty_cache()
    return rows


# part prologue-FAMILY: the fused decode linears at one row of a family preset's shapes, with the prologue each
# takes in the engine (OLMo 2 normalises after attention and the MLP: its qkv and gate_up have none)
FAMILY_SHAPES = {
    "gemma": ({"qkv": (8192, 3584), "o_proj": (3584, 4096), "gate_up": (28672, 3584), "down": (3584, 14336),
               "lm_head": (256000, 3584)}, dict(PROLOGUE_OF, down="gelu_mul")),  # Gemma 2 9B
    "phi3": ({"qkv": (9216, 3072), "o_proj": (3072, 3072), "gate_up": (16384, 3072), "down": (3072, 8192),
              "lm_head": (32064, 3072)}, PROLOGUE_OF),  # Phi-3-mini
    "olmo2": ({"qkv": (12288, 4096), "o_proj": (4096, 4096), "gate_up": (22016, 4096), "down": (4096, 11008),
               "lm_head": (100352, 4096)}, dict(PROLOGUE_OF, qkv="none", gate_up="none")),  # OLMo 2 7B
    # Qwen3-30B-A3B's dense linears (the experts run the fused MoE kernels): at one row on the H200 (s32 call 2,
    # moe-prof1-nopdl) qkv took 10.1 us (2.1 TB/s), o_proj 8.3 (2.0), the router 5.4
    "qwen3moe": ({"qkv": (5120, 2048), "o_proj": (2048, 4096), "router": (128, 2048)},
                 dict(PROLOGUE_OF, router="none")),
}


def sweep_prologue(shapes=SHAPES, prologue_of=PROLOGUE_OF, rows_m=(1, 8, 16),
                   configs=prologue_configs) -> list[dict]:
    rows = []
    for name, (n, k) in shapes.items():
        prologue = prologue_of[name]
        weights = streamed_weights(n, k)
        nbytes = n * k * 2
        for m in rows_m:
            x = torch.randn(m, 2 * k if prologue in ("silu_mul", "gelu_mul") else k, device="cuda", dtype=DTYPE)
            residual, norm_w = torch.randn(m, k, device="cuda", dtype=DTYPE), 1 + torch.randn(k, device="cuda", dtype=DTYPE) / 4
            unfused, fused = prologue_calls(prologue, x, residual, norm_w)
            ref = unfused(weights[0]).float()
            before = graph_seconds([lambda w=w: unfused(w) for w in weights])
            operand = unfused_operand(prologue, x, residual, norm_w)  # cuBLAS itself: `before` follows the routing
            cublas = graph_seconds([lambda w=w: F.linear(operand, w) for w in weights])
            default = default_config(m, n, k, x.device)
            timings = time_configs(lambda c: prologue_calls(prologue, x, residual, norm_w, c)[1],
                                   [default, *(configs() if m < 16 else ())], weights, ref, (name, m))
            best_s, best = min(timings, key=lambda t: t[0])
            row = {"shape": name, "prologue": prologue, "m": m, "n": n, "k": k, "before_us": before * 1e6,
                   "cublas_us": cublas * 1e6,
                   "default_us": timings[0][0] * 1e6, "default_config": default, "best_us": best_s * 1e6,
                   "best_config": best, "best_tb_s": nbytes / best_s / 1e12, "default_tb_s": nbytes / timings[0][0] / 1e12}
            rows.append(row)
            print(json.dumps(row), flush=True)
        del weights
        torch.cuda.empty_cache()
    return rows


CHAIN_LAYERS = 8  # 3.5 GB of weights: every layer streams from HBM


def chain_step(layers: list[dict], h: torch.Tensor, fused: bool) -> torch.Tensor:
    """The linears of `layers` in decode order on hidden state h ([M, 4096]); returns the last residual."""
    residual, attn = h, h
    for w in layers:
        if fused:
            qkv, residual = add_rms_norm_linear(attn, residual, w["norm1"], 1e-5, w["qkv"])
            o = linear(qkv[:, :4096], w["o_proj"])
            gate_up, residual = add_rms_norm_linear(o, residual, w["norm2"], 1e-5, w["gate_up"])
            attn = silu_and_mul_linear(gate_up, w["down"])
        else:
            normed, residual = rms_norm(attn, w["norm1"], 1e-5, residual)
            o = linear(linear(normed, w["qkv"])[:, :4096].contiguous(), w["o_proj"])
            normed, residual = rms_norm(o, w["norm2"], 1e-5, residual)
            attn = linear(silu_and_mul(linear(normed, w["gate_up"])), w["down"])
    return residual


def sweep_chain() -> list[dict]:
    make = lambda name: torch.randn(*SHAPES[name], device="cuda", dtype=DTYPE) / SHAPES[name][1] ** 0.5  # noqa: E731
    layers = [{**{name: make(name) for name in ("qkv", "o_proj", "gate_up", "down")},
               "norm1": torch.ones(4096, device="cuda", dtype=DTYPE), "norm2": torch.ones(4096, device="cuda", dtype=DTYPE)}
              for _ in range(CHAIN_LAYERS)]
    nbytes = sum(w.numel() * 2 for layer in layers for w in layer.values())
    rows = []
    for m in (1, 8):
        h = torch.randn(m, 4096, device="cuda", dtype=DTYPE)
        ref = chain_step(layers, h, fused=False).float()
        row = {"m": m, "layers": CHAIN_LAYERS, "weight_gb": nbytes / 1e9}
        for fused in (False, True):
            got = chain_step(layers, h, fused).float()
            assert (got - ref).abs().max().item() < 0.5, (m, fused)
            s = graph_seconds([lambda f=fused: chain_step(layers, h, f)], reps=10)
            key = "fused" if fused else "unfused"
            row[f"{key}_us_per_layer"] = s * 1e6 / CHAIN_LAYERS
            row[f"{key}_tb_s"] = nbytes / s / 1e12
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


EPILOGUE_SHAPES = {"llama-3-8b": ((28672, 4096), (4096, 14336)), "phi-3-mini": ((16384, 3072), (3072, 8192))}


def interleaved_configs(m: int):
    for bn, bk, stages in itertools.product((16, 32, 64) if m == 1 else (32, 64, 128),
                                            (256, 512) if m == 1 else (128, 256), (3, 4)):
        yield {"BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": 1, "num_warps": 4, "num_stages": stages}


def sweep_epilogue() -> list[dict]:
    """us per call (CUDA-graph replay under PDL, weights streamed from HBM): see the module docstring."""
    from graphllm.ops.linear import linear_act_and_mul
    from graphllm.ops.silu_and_mul import silu_and_mul as silu_and_mul_op
    rows = []
    for family, ((n, k), (n2, k2)) in EPILOGUE_SHAPES.items():
        copies = max(2, int(STREAM_BYTES // ((n * k + n2 * k2) * 2)) + 1)
        pairs = [(torch.randn(n, k, device="cuda", dtype=DTYPE) / k ** 0.5,
                  torch.randn(n2, k2, device="cuda", dtype=DTYPE) / k2 ** 0.5) for _ in range(copies)]
        pairs = [(gu, interleave_gate_up(gu), down) for gu, down in pairs]
        for m in (1, 2, 8):
            x = torch.randn(m, k, device="cuda", dtype=DTYPE)
            ref = silu_and_mul(linear(x, pairs[0][0])).float()
            row = {"family": family, "m": m}
            with programmatic_launch(True):
                grid = time_configs(lambda c: lambda w: matmul_act_mul(x, w, config=c, interleaved=True)[0],
                                    interleaved_configs(m), [p[1] for p in pairs], ref, (family, m))
                best_s, best = min(grid, key=lambda t: t[0])
                row["interleaved_best_config"] = best
                default = interleaved_config(m, n, k, x.device)
                mlps = {
                    "gate_up_us": lambda gu, il, down: linear(x, gu),
                    "interleaved_gate_up_us": lambda gu, il, down: matmul_act_mul(x, il, interleaved=True)[0],
                    "two_launch_mlp_us": lambda gu, il, down: linear(silu_and_mul_op(linear(x, gu)), down),
                    "prologue_mlp_us": lambda gu, il, down: silu_and_mul_linear(linear(x, gu), down),
                    "halves_mlp_us": lambda gu, il, down: linear(linear_act_and_mul(x, gu), down),
                    "interleaved_mlp_us": lambda gu, il, down: linear(matmul_act_mul(x, il, interleaved=True)[0], down),
                    "interleaved_best_mlp_us": lambda gu, il, down: linear(
                        matmul_act_mul(x, il, config=best, interleaved=True)[0], down),
                }
                want = linear(silu_and_mul(linear(x, pairs[0][0])), pairs[0][2]).float()
                for key, mlp in mlps.items():
                    if key.endswith("mlp_us"):
                        got = mlp(*pairs[0]).float()
                        assert (got - want).abs().max().item() < 0.1 * want.abs().max().item() + 1e-2, (key, m)
                    row[key] = graph_seconds([lambda p=p, f=mlp: f(*p) for p in pairs]) * 1e6
            row["interleaved_best_us"] = best_s * 1e6
            row["interleaved_default_config"] = default
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


HQ, HKV, HEAD_DIM, BLOCK_SIZE, TABLE_WIDTH = 32, 8, 128, 16, 2048 // 16  # the 8B shape, max_model_len 2048
GEMMA2_HEADS = dict(HQ=16, HKV=8, HEAD_DIM=256, SOFTCAP=50.0)  # Gemma 2 9B: attention part attention-gemma
PHI3_HEADS = dict(HQ=32, HKV=32, HEAD_DIM=96, SOFTCAP=0.0)  # Phi-3-mini (no GQA, 96-wide heads): attention-phi3


def paged_decode_inputs(batch: int, ctx: int, HQ=HQ, HKV=HKV, HEAD_DIM=HEAD_DIM) -> tuple:  # noqa: N803
    """(KV caches, enough layers of them to stream from HBM, block tables [B, TABLE_WIDTH] over
    shuffled pages, seq_lens, q [B, HQ, D], KV bytes one call must read) for `batch` sequences of `ctx` tokens."""
    pages = triton.cdiv(ctx, BLOCK_SIZE)
    per_layer = 2 * batch * pages * BLOCK_SIZE * HKV * HEAD_DIM * 2
    layers = max(2, int(STREAM_BYTES // per_layer) + 1)
    caches = [torch.randn(2, batch * pages + 1, BLOCK_SIZE, HKV, HEAD_DIM, device="cuda", dtype=DTYPE)
              for _ in range(layers)]
    tables = torch.randperm(batch * pages, device="cuda").view(batch, pages)
    width = max(TABLE_WIDTH, pages)  # longer prompts (the prefill part's 8,192 tokens) get wider tables
    tables = torch.cat([tables, torch.zeros(batch, width - pages, dtype=tables.dtype, device="cuda")], 1)
    lens = torch.full((batch,), ctx, device="cuda", dtype=torch.int64)
    q = torch.randn(batch, HQ, HEAD_DIM, device="cuda", dtype=DTYPE)
    return caches, tables, lens, q, 2 * batch * ctx * HKV * HEAD_DIM * 2


# paged_decode_attention's knobs timed over the float8 cache: the grid with a sequence's heads side by side,
# the software pipeline's depth, 128-key tiles (a bf16 tile's bytes; the default at one split since s22) and 8 warps
# a program
FP8_DECODE_KNOBS = {"heads_first": dict(heads_first=True), "stages2": dict(num_stages=2),
                    "stages4": dict(num_stages=4), "block128": dict(block_n=128),
                    "block128_heads_first": dict(block_n=128, heads_first=True), "warps8": dict(num_warps=8),
                    "block128_warps8": dict(block_n=128, num_warps=8), "warps2": dict(num_warps=2),
                    # fewer warps a program, so that each warp's softmax needs fewer cross-warp reductions, and
                    # smaller tiles, so that more programs fit an SM's shared memory
                    "warps1_block32": dict(num_warps=1, block_n=32, num_stages=2),
                    "warps2_block32": dict(num_warps=2, block_n=32),
                    # the 64-key tile that was the default at one split until s22 (now 128: decode_block_n), and
                    # the 128-key default with a shallower pipeline (less shared memory: more programs an SM)
                    "block64": dict(block_n=64), "block128_stages2": dict(block_n=128, num_stages=2),
                    "warps2_block64_stages2": dict(num_warps=2, block_n=64, num_stages=2),
                    # registers set the occupancy (offline sm_90 build, s22): 112 a thread at 64-key tiles (4
                    # programs, 16 warps an SM), 141 at 128 (3 programs, 12 warps); capped, a few bytes spill
                    "block64_maxnreg96": dict(block_n=64, maxnreg=96),
                    "block128_maxnreg128": dict(block_n=128, maxnreg=128),
                    # the dots over the head's two halves (one_token_attention's HALVES): 90 registers at 64-key
                    # tiles (5 programs, 20 warps an SM) and 363 instructions a tile against 112 and 393
                    "halves_block64": dict(head_halves=True, block_n=64),
                    "halves_block64_stages2": dict(head_halves=True, block_n=64, num_stages=2),
                    "halves_block128_stages2": dict(head_halves=True, block_n=128, num_stages=2),
                    # 24 warps an SM under Triton 3.6: 32-key tiles (80 registers, 6 programs) or 8 warps (71, 3)
                    "halves_block32": dict(head_halves=True, block_n=32),
                    "halves_block64_warps8": dict(head_halves=True, block_n=64, num_warps=8),
                    # q.K in float8 with the keys on the MMA's M side (fp8_qk: sm_90's float8 wgmma reads the key
                    # tile from shared memory; q rounded per head). Triton 3.6 offline: 431 instructions a 64-key
                    # tile over 3 stages (116 registers, 45.5 KB), 384 over 2 (104, 45 KB), 572 a 128-key tile over
                    # 2 (142, 88 KB: 2 programs an SM)
                    "fp8qk_block64": dict(fp8_qk=True, block_n=64),
                    "fp8qk_block64_stages2": dict(fp8_qk=True, block_n=64, num_stages=2),
                    "fp8qk_block128_stages2": dict(fp8_qk=True, block_n=128, num_stages=2)}


def decode_launch_fusions(caches, tables, lens, q, scale, fp8_caches=None, fp8_knobs=()) -> dict:
    """us per call of a decode layer's attention launches, bf16, the fusion against what it replaces:
    rope_store_kv then the decode kernel against the decode kernel rotating and storing the new token itself
    (new_tokens, kernels/rope_decode.py). With fp8_caches, the fused launch over them too, decode_tiling's default
    against q.K over converted keys (fp8_qk=False): the engine's decode launch over an fp8 cache; fp8_knobs: more
    (name, paged_decode_attention knobs) of that launch to time."""
    batch = q.shape[0]
    k, v = (torch.randn(batch, HKV, HEAD_DIM, device="cuda", dtype=DTYPE) for _ in range(2))
    angles = torch.rand(batch, HEAD_DIM // 2, device="cuda") * 6
    cos, sin = (torch.cat([f(angles)] * 2, 1).to(DTYPE) for f in (torch.cos, torch.sin))
    last = lens - 1
    slots = tables.gather(1, (last // BLOCK_SIZE)[:, None])[:, 0] * BLOCK_SIZE + last % BLOCK_SIZE
    out = {}
    out["rope_then_decode_us"] = 1e6 * graph_seconds([
        lambda c=c: paged_decode_attention(rope_store_kv(q, k, v, cos, sin, c, slots), c[0], c[1], tables, lens, scale,
                                           0) for c in caches])
    out["rope_in_decode_us"] = 1e6 * graph_seconds([
        lambda c=c: paged_decode_attention(q, c[0], c[1], tables, lens, scale, 0,
                                           new_tokens=NewTokens(k, v, cos, sin, slots)) for c in caches])
    fp8_knobs = (("fp8_rope_in_decode_us", {}), ("fp8_rope_in_decode_converted_us", dict(fp8_qk=False)), *fp8_knobs)
    for name, knobs in fp8_knobs if fp8_caches else ():
        try:  # a knob the kernels under test do not have (an older tree's, ab-sweep-*) is reported, not fatal
            out[name] = 1e6 * graph_seconds([
                lambda c=c, kw=knobs: paged_decode_attention(q, c[0], c[1], tables, lens, scale, 0, **kw,
                                                             new_tokens=NewTokens(k, v, cos, sin, slots))
                for c in fp8_caches])
        except TypeError as exc:
            out[name.replace("_us", "_error")] = str(exc)[:200]
    return out


def head_major(cache: torch.Tensor) -> torch.Tensor:
    """A copy of a [2, blocks, block_size, Hkv, D] cache stored as [2, blocks, Hkv, block_size, D], viewed back in
    the kernel's index order (it reads any strides): how much an fp8 decode gains from contiguous pages per head."""
    two, blocks, block_size, heads, dim = cache.shape
    out = torch.empty((two, blocks, heads, block_size, dim), dtype=cache.dtype, device=cache.device)
    out = out.permute(0, 1, 3, 2, 4)
    out.copy_(cache)
    return out


def sweep_attention() -> list[dict]:
    rows, scale = [], HEAD_DIM ** -0.5
    for batch, ctx in [(1, 256), (1, 512), (8, 256), (8, 512), (32, 1024), (128, 1024), (192, 850), (256, 1024)]:
        caches, tables, lens, q, kv_bytes = paged_decode_inputs(batch, ctx)
        default = default_num_splits(batch, HKV, tables.shape[1] * BLOCK_SIZE, 64, q.device)
        row = {"batch": batch, "context": ctx, "kv_mb": kv_bytes / 1e6, "default_splits": default}
        for splits in sorted({default, 1, 2, 4, 8, 16}):
            s = graph_seconds([lambda c=c, n=splits: paged_decode_attention(q, c[0], c[1], tables, lens, scale, 0, n)
                               for c in caches])
            row[f"splits{splits}_us"] = s * 1e6
            row[f"splits{splits}_tb_s"] = kv_bytes / s / 1e12
        row["bf16_default_us"] = row[f"splits{default}_us"]
        s = graph_seconds([lambda c=c: paged_decode_attention(q, c[0], c[1], tables, lens, scale, 0, num_warps=8)
                           for c in caches])
        row["bf16_default_8warps_us"] = s * 1e6  # 4 warps spill registers in an offline sm_90 build
        fp8_caches = [c.to(torch.float8_e4m3fn) for c in caches]  # randn lies well inside +-448: unit scales
        s = graph_seconds([lambda c=c: paged_decode_attention(q, c[0], c[1], tables, lens, scale, 0)
                           for c in fp8_caches])
        row["fp8_default_us"] = s * 1e6
        row["fp8_tb_s"] = kv_bytes / 2 / s / 1e12
        s = graph_seconds([lambda c=c: paged_decode_attention(q, c[0], c[1], tables, lens, scale, 0,
                                                              fp8_conversion=FP8_TRITON.value, fp8_qk=False)
                           for c in fp8_caches])
        row["fp8_triton_conversion_us"] = s * 1e6  # the default converts as loaded (FP8_CVT): the A/B
        row["fp8_triton_conversion_tb_s"] = kv_bytes / 2 / s / 1e12
        s = graph_seconds([lambda c=c: paged_decode_attention(q, c[0], c[1], tables, lens, scale, 0, fp8_qk=False)
                           for c in fp8_caches])
        row["fp8_converted_default_us"] = s * 1e6  # decode_tiling's tiles with q.K over converted keys (s23's default)
        # why an fp8 cache's decode is no faster at 128+ sequences (from 32: below, the default splits)
        for name, knobs in FP8_DECODE_KNOBS.items() if batch >= 32 else ():
            knobs = {"head_halves": False, "num_stages": 3, "fp8_qk": False, **knobs}  # the rest as before decode_tiling
            s = graph_seconds([lambda c=c, kw=knobs: paged_decode_attention(q, c[0], c[1], tables, lens, scale, 0,
                                                                            **kw) for c in fp8_caches])
            row[f"fp8_{name}_us"] = s * 1e6
        s = graph_seconds([lambda c=c: paged_decode_attention(q, c[0], c[1], tables, lens, scale, 0, heads_first=True)
                           for c in caches])
        row["bf16_heads_first_us"] = s * 1e6
        row.update(decode_launch_fusions(caches, tables, lens, q, scale, fp8_caches if batch >= 32 else None))
        for name, layers, knobs in (("bf16", caches, {}), ("fp8", fp8_caches, {}),
                                    ("fp8_block128", fp8_caches, dict(block_n=128))):
            major = [head_major(c) for c in layers]  # a page's tokens of one head contiguous: 16 x 128 B in fp8
            s = graph_seconds([lambda c=c: paged_decode_attention(q, c[0], c[1], tables, lens, scale, 0, **knobs)
                               for c in major])
            row[f"{name}_head_major_us"] = s * 1e6
            del major
        del fp8_caches
        rows.append(row)
        print(json.dumps(row), flush=True)
        del caches
        torch.cuda.empty_cache()
    return rows


# a throughput run's decode steps: 256 and 512 sequences over ~544 keys (512-token prompts), and 1,024 keys
LAUNCH_SHAPES = [(128, 1024), (256, 544), (256, 1024), (512, 544)]
# q.K in float8 capped at 96 registers a thread (110 under Triton 3.6, offline sm_90 build: 4 programs an SM; at 96, 8
# bytes spilled, 5 fit the registers and 5 x 45 KB the shared memory)
FP8_LAUNCH_KNOBS = (("fp8_rope_in_decode_maxnreg96_us", dict(maxnreg=96)),
                    # P.V with the values on the wgmma's M side (pv_wgmma: 331 SASS instructions a tile against 354,
                    # 103 registers against 110, offline sm_90 build, s32)
                    ("fp8_rope_in_decode_pv_wgmma_us", dict(pv_wgmma=True)),
                    # and at 96 registers (16 bytes spilled, 348 instructions a tile): 5 programs an SM
                    ("fp8_rope_in_decode_pv_wgmma_maxnreg96_us", dict(pv_wgmma=True, maxnreg=96)))


def sweep_attention_launch() -> list[dict]:
    """The engine's decode launch alone (rotary and KV write inside) over bf16 and fp8 caches at a throughput run's
    shapes, us per call and the share of the copy rate each cache's bytes stream at: quick, for an A/B between two
    trees (gpu_run.sh's ab-sweep-attention-launch runs this script over .ab/'s kernels)."""
    rows, scale = [], HEAD_DIM ** -0.5
    for batch, ctx in LAUNCH_SHAPES:
        caches, tables, lens, q, kv_bytes = paged_decode_inputs(batch, ctx)
        fp8_caches = [c.to(torch.float8_e4m3fn) for c in caches]
        row = {"batch": batch, "context": ctx, "kv_mb": kv_bytes / 1e6,
               **decode_launch_fusions(caches, tables, lens, q, scale, fp8_caches, FP8_LAUNCH_KNOBS)}
        row["bf16_tb_s"] = kv_bytes / row["rope_in_decode_us"] / 1e6
        row["fp8_tb_s"] = kv_bytes / 2 / row["fp8_rope_in_decode_us"] / 1e6
        rows.append(row)
        print(json.dumps(row), flush=True)
        del caches, fp8_caches
        torch.cuda.empty_cache()
    return rows


def stream_seconds(calls: list, reps: int = 10) -> float:
    """Mean seconds of one call, launched eagerly in sequence (for kernels whose wrappers are not captured here)."""
    for call in calls:
        call()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        for call in calls:
            call()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / reps / len(calls)


def sweep_attention_flashinfer(wrappers: bool = True) -> list[dict]:
    """An fp8 cache's decode at a throughput run's shapes: this project's kernel (no rotary inside, as FlashInfer's)
    against FlashInfer's paged decode over the same float8 pages (CUDA cores, and its tensor-core path), both
    launched eagerly, us per call; and TensorRT-LLM's XQA decode (flashinfer.xqa) over both. On the H200 the
    engine's fp8 launch streams at ~1.8 TB/s (s32 call 2: 156 us a layer at 256 x ~544), slower than bf16's;
    FlashInfer's decode converts in registers, without MMAs. wrappers=False (attention-xqa): this kernel and XQA
    only (FlashInfer's wrappers JIT-build three more modules on a fresh machine)."""
    import flashinfer
    from flashinfer.xqa import xqa as xqa_decode
    rows, scale = [], HEAD_DIM ** -0.5
    workspace = torch.zeros(256 * 2**20, dtype=torch.uint8, device="cuda")
    for batch, ctx in LAUNCH_SHAPES:
        caches, tables, lens, q, kv_bytes = paged_decode_inputs(batch, ctx)
        fp8_caches = [c.to(torch.float8_e4m3fn) for c in caches]
        pages = triton.cdiv(ctx, BLOCK_SIZE)
        i32 = dict(dtype=torch.int32, device="cuda")
        indptr = torch.arange(0, batch + 1, **i32) * pages
        indices = tables[:, :pages].reshape(-1).to(torch.int32)
        last = torch.full((batch,), (ctx - 1) % BLOCK_SIZE + 1, **i32)
        row = {"batch": batch, "context": ctx, "fp8_mb": kv_bytes / 2e6}
        s = stream_seconds([lambda c=c: paged_decode_attention(q, c[0], c[1], tables, lens, scale, 0)
                            for c in fp8_caches])
        row["ours_us"] = s * 1e6
        s = stream_seconds([lambda c=c: paged_decode_attention(q, c[0], c[1], tables, lens, scale, 0) for c in caches])
        row["ours_bf16_us"] = s * 1e6  # the same launches over the bf16 pages the float8 ones came from
        variants = (("flashinfer_us", False, fp8_caches), ("flashinfer_tc_us", True, fp8_caches),
                    ("flashinfer_bf16_us", False, caches))
        for name, tensor_cores, layers in variants if wrappers else ():
            try:
                wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD",
                                                                        use_tensor_cores=tensor_cores)
                wrapper.plan(indptr, indices, last, HQ, HKV, HEAD_DIM, BLOCK_SIZE, sm_scale=scale,
                             q_data_type=q.dtype, kv_data_type=layers[0].dtype)
                ref = paged_decode_attention(q, layers[0][0], layers[0][1], tables, lens, scale, 0, fp8_qk=False)
                got = wrapper.run(q, (layers[0][0], layers[0][1]))
                row[name.replace("_us", "_max_err")] = (got.float() - ref.float()).abs().max().item()
                s = stream_seconds([lambda c=c, w=wrapper: w.run(q, (c[0], c[1])) for c in layers])
                row[name] = s * 1e6
            except Exception as exc:  # noqa: BLE001 - a variant that fails to build is reported, not fatal
                row[name.replace("_us", "_error")] = f"{type(exc).__name__}: {str(exc)[:300]}"
        # TensorRT-LLM's XQA decode as FlashInfer ships it (flashinfer.xqa): it reads the padded block table and the
        # lengths on the device (no host plan, so it captures into a CUDA graph as this kernel does); over float8
        # pages on sm_90 it runs its Hopper kernel (mha_sm90: TMA loads, float8 MMAs). Its softmax scale is
        # q_scale * kv_scale / sqrt(D), and the output is scaled by kv_scale.
        seq_lens = lens.to(torch.uint32)[:, None]
        nb_seq = HKV * batch
        semaphores = torch.zeros(2 * triton.cdiv(nb_seq, 2) + 2 + nb_seq + 2, dtype=torch.uint32, device="cuda")
        q4 = q[:, None]
        for name, layers in (("xqa_us", fp8_caches), ("xqa_bf16_us", caches)):
            try:
                out = torch.empty_like(q4)

                def xqa(c, out=out):
                    xqa_decode(q4, c[0], c[1], tables.to(torch.int32), seq_lens, out, workspace, semaphores,
                                       HKV, BLOCK_SIZE, q_scale=scale * HEAD_DIM ** 0.5)
                    return out
                ref = paged_decode_attention(q, layers[0][0], layers[0][1], tables, lens, scale, 0, fp8_qk=False)
                got = xqa(layers[0])[:, 0]
                torch.cuda.synchronize()
                row[name.replace("_us", "_max_err")] = (got.float() - ref.float()).abs().max().item()
                row[name] = stream_seconds([lambda c=c: xqa(c) for c in layers]) * 1e6
            except Exception as exc:  # noqa: BLE001 - as above
                row[name.replace("_us", "_error")] = f"{type(exc).__name__}: {str(exc)[:300]}"
        for key in ("ours_us", "flashinfer_us", "flashinfer_tc_us", "xqa_us", "ours_bf16_us", "flashinfer_bf16_us",
                    "xqa_bf16_us"):
            if key in row:  # each cache's own bytes
                row[key.replace("_us", "_tb_s")] = kv_bytes / (1 if "bf16" in key else 2) / row[key] / 1e6
        rows.append(row)
        print(json.dumps(row), flush=True)
        del fp8_caches, caches
        torch.cuda.empty_cache()
    return rows


def sweep_attention_heads(HQ, HKV, HEAD_DIM, SOFTCAP) -> list[dict]:  # noqa: N803
    """Decode attention at batch 1 and 8 for another head shape (Gemma 2's: 256-wide heads, group 2, soft cap):
    the default splits against forced ones, 4 and 8 warps."""
    rows, scale = [], HEAD_DIM ** -0.5
    block_n = 64 if HEAD_DIM <= 128 else 32  # paged_decode_attention's
    for batch, ctx in [(1, 128), (1, 256), (1, 512), (1, 1024), (8, 256), (8, 512)]:
        caches, tables, lens, q, kv_bytes = paged_decode_inputs(batch, ctx, HQ, HKV, HEAD_DIM)
        default = default_num_splits(batch, HKV, tables.shape[1] * BLOCK_SIZE, block_n, q.device)
        row = {"heads": [HQ, HKV, HEAD_DIM], "softcap": SOFTCAP, "batch": batch, "context": ctx,
               "kv_mb": kv_bytes / 1e6, "default_splits": default}
        for splits, warps in itertools.product(sorted({default, 1, 2, 4, 8, 16}), (4, 8)):
            s = graph_seconds([lambda c=c, n=splits, w=warps: paged_decode_attention(
                q, c[0], c[1], tables, lens, scale, 0, n, num_warps=w, logit_softcap=SOFTCAP) for c in caches])
            row[f"splits{splits}_w{warps}_us"] = s * 1e6
        rows.append(row)
        print(json.dumps(row), flush=True)
        del caches
        torch.cuda.empty_cache()
    return rows


def sweep_mixed() -> list[dict]:
    """The decode rows of a mixed step (one new token each) as paged_prefill_attention runs them:
    in the prefill kernel's one-token path, or in a decode-kernel launch in its mixed mode beside
    a prefill launch whose programs all exit; against the decode kernel's own decode launch."""
    rows, scale = [], HEAD_DIM ** -0.5
    for batch, ctx in [(64, 850), (256, 850)]:
        caches, tables, lens, q, kv_bytes = paged_decode_inputs(batch, ctx)
        starts = torch.arange(batch + 1, device="cuda")
        decode = graph_seconds([lambda c=c: paged_decode_attention(q, c[0], c[1], tables, lens, scale, 0)
                                for c in caches])
        row = {"batch": batch, "context": ctx, "decode_kernel_us": decode * 1e6,
               "decode_tb_s": kv_bytes / decode / 1e12}
        for name, min_seqs in [("prefill_kernel", 1 << 30), ("mixed_decode_launch", 0)]:
            s = graph_seconds([lambda c=c, m=min_seqs: paged_prefill_attention(
                q, c[0], c[1], tables, lens, starts, scale, 0, decode_kernel_min_seqs=m) for c in caches])
            row[f"{name}_us"], row[f"{name}_tb_s"] = s * 1e6, kv_bytes / s / 1e12
        rows.append(row)
        print(json.dumps(row), flush=True)
        del caches
        torch.cuda.empty_cache()
    return rows


# paged_prefill_attention's tiles timed against its default (PREFILL_TILE: 64 query rows, 64 keys, 4 warps, 3 stages)
PREFILL_TILES = {"default": {}, "w8": dict(num_warps=8), "m128": dict(block_m=128), "m128_w8": dict(block_m=128, num_warps=8),
                 "m128_n128_w8": dict(block_m=128, block_n=128, num_warps=8), "n128": dict(block_n=128),
                 "m128_w8_s2": dict(block_m=128, num_warps=8, num_stages=2), "s4": dict(num_stages=4),
                 "s2": dict(num_stages=2)}


def sweep_prefill(tiles: dict = PREFILL_TILES, projections: bool = True) -> list[dict]:
    """A large prefill step's parts (this module's docstring, prefill): attention over fresh prompts, the
    projections at 8,192 rows, the SwiGLU between them. Outputs are checked against the reference first.
    tiles: the attention tiles timed; projections False: the attention alone (part prefill-default: the
    tiles prefill_tile picks, for a quick A/B of the kernel against .ab/'s)."""
    from graphllm.kernels.paged_prefill_attention import paged_prefill_attention_reference
    rows, scale = [], HEAD_DIM ** -0.5
    # a throughput run's mixed step holds one ~900-token prompt; 8,192 tokens: a long prompt's time to first token
    for prompts, length in [(1, 900), (8, 1024), (2, 2048), (16, 512), (1, 8192)]:
        caches, tables, _, _, _ = paged_decode_inputs(prompts, length)
        lens = torch.full((prompts,), length, device="cuda", dtype=torch.int64)
        starts = torch.arange(prompts + 1, device="cuda") * length
        q = torch.randn(prompts * length, HQ, HEAD_DIM, device="cuda", dtype=DTYPE)
        flop = 4 * HQ * HEAD_DIM * prompts * length * (length + 1) / 2  # QK and PV over the causal keys
        row = {"prompts": prompts, "length": length, "gflop": flop / 1e9}
        ref = paged_prefill_attention_reference(q, caches[0][0], caches[0][1], tables, lens, starts, scale, 0) \
            if prompts * length <= 8192 else None  # the reference's [H, t, L] scores of 8,192 tokens: 8 GiB
        for name, tile in tiles.items():
            try:
                got = paged_prefill_attention(q, caches[0][0], caches[0][1], tables, lens, starts, scale, 0, **tile)
                if ref is not None:
                    assert (got.float() - ref.float()).abs().max().item() < 0.05, name
                s = graph_seconds([lambda c=c, t=tile: paged_prefill_attention(
                    q, c[0], c[1], tables, lens, starts, scale, 0, **t) for c in caches[:2]], reps=5)
            except Exception as e:  # noqa: BLE001 - a tile that does not fit (shared memory) is reported, not fatal
                row[f"{name}_error"] = f"{type(e).__name__}: {str(e)[:120]}"
                continue
            row[f"{name}_ms"], row[f"{name}_tflop_s"] = s * 1e3, flop / s / 1e12
        rows.append(row)
        print(json.dumps(row), flush=True)
        del caches
        torch.cuda.empty_cache()
    if not projections:
        return rows
    x = torch.randn(8192, SHAPES["qkv"][1], device="cuda", dtype=DTYPE)
    for name, (n, k) in SHAPES.items():
        if name == "lm_head":
            continue
        w = torch.randn(n, k, device="cuda", dtype=DTYPE) / k ** 0.5
        a = x if k == x.shape[1] else torch.randn(8192, k, device="cuda", dtype=DTYPE)
        s = graph_seconds([lambda: F.linear(a, w)] * 4, reps=5)
        rows.append({"shape": name, "m": 8192, "cublas_ms": s * 1e3, "tflop_s": 2 * 8192 * n * k / s / 1e12})
        print(json.dumps(rows[-1]), flush=True)
    gate_up = torch.randn(8192, SHAPES["gate_up"][0], device="cuda", dtype=DTYPE)
    s = graph_seconds([lambda: silu_and_mul(gate_up)] * 4, reps=5)
    rows.append({"op": "silu_and_mul", "m": 8192, "ms": s * 1e3, "tb_s": gate_up.numel() * 3 / s / 1e12})
    print(json.dumps(rows[-1]), flush=True)
    return rows


def sweep_argmax() -> list[dict]:
    """Greedy sampling's argmax over a vocabulary of logits: PyTorch's one-pass argmax against the
    sampler's two-stage argmax_rows (same indices, checked on tie-heavy logits)."""
    from graphllm.runtime.sampler import argmax_rows
    rows = []
    for batch in (1, 8, 256):
        logits = torch.randint(-200, 200, (batch, SHAPES["lm_head"][0]), device="cuda").to(DTYPE)
        assert torch.equal(argmax_rows(logits), logits.argmax(dim=-1))
        row = {"batch": batch, "argmax_us": graph_seconds([lambda: logits.argmax(dim=-1)] * 8) * 1e6,
               "argmax_rows_us": graph_seconds([lambda: argmax_rows(logits)] * 8) * 1e6}
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    out, parts = sys.argv[1], set(sys.argv[2:]) or {"matmul", "matmul8", "attention", "mixed", "prologue", "chain"}
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}
    if "matmul" in parts:
        report["matmul"] = sweep_matmul()
    if "matmul8" in parts:
        report["matmul8"] = sweep_matmul8()
    if "attention" in parts:
        report["attention"] = sweep_attention()
    if "attention-launch" in parts:
        report["attention_launch"] = sweep_attention_launch()
    if "attention-flashinfer" in parts:
        report["attention_flashinfer"] = sweep_attention_flashinfer()
    if "attention-xqa" in parts:
        report["attention_xqa"] = sweep_attention_flashinfer(wrappers=False)
    if "attention-gemma" in parts:
        report["attention_gemma"] = sweep_attention_heads(**GEMMA2_HEADS)
    if "attention-phi3" in parts:
        report["attention_phi3"] = sweep_attention_heads(**PHI3_HEADS)
    if "argmax" in parts:
        report["argmax"] = sweep_argmax()
    if "mixed" in parts:
        report["mixed"] = sweep_mixed()
    if "prefill" in parts:
        report["prefill"] = sweep_prefill()
    if "prefill-default" in parts:
        report["prefill_default"] = sweep_prefill({"default": {}}, projections=False)
    if "prologue" in parts:
        report["prologue"] = sweep_prologue()
    for family, (shapes, prologue_of) in FAMILY_SHAPES.items():
        if f"prologue-{family}" in parts:  # one row, 4 warps (8 never won at one row)
            report[f"prologue_{family}"] = sweep_prologue(shapes, prologue_of, (1,), lambda: (
                c for c in prologue_configs() if c["num_warps"] == 4))
    if "chain" in parts:
        report["chain"] = sweep_chain()
    if "epilogue" in parts:
        report["epilogue"] = sweep_epilogue()
    with open(out, "w") as f:
        json.dump(report, f, indent=1)
    print("\nshape     m  cuBLAS TB/s  ours(default) TB/s  ours(best) TB/s  best config")
    for r in report.get("matmul", []):
        if "best_tb_s" in r:
            c = r["best_config"]
            print(f"{r['shape']:<8} {r['m']:>3}  {r['cublas_tb_s']:11.2f}  {r['default_tb_s']:18.2f}  "
                  f"{r['best_tb_s']:15.2f}  {c['BLOCK_N']}x{c['BLOCK_K']} w{c['num_warps']} s{c['num_stages']}")
        else:
            print(f"{r['shape']:<8} {r['m']:>3}  cuBLAS {r['cublas_us']:.1f} us")
    for r in report.get("matmul8", []):
        c = r["best_config"]
        print(f"{r['shape']:<8} M=8 cuBLAS {r['cublas_us']:6.1f} us  ours default {r['default_us']:6.1f} us  best "
              f"{r['best_us']:6.1f} us ({r['best_tb_s']:.2f} TB/s) {c['BLOCK_N']}x{c['BLOCK_K']} w{c['num_warps']} "
              f"split{c['SPLIT_K']}  by split: {r['best_us_by_split_k']}")
    for r in report.get("attention", []):
        cells = " ".join(f"{k.removesuffix('_tb_s')}={v:.2f}" for k, v in r.items() if k.endswith("_tb_s"))
        print(f"attention B={r['batch']} ctx={r['context']} default splits {r['default_splits']}: TB/s {cells}")
        knobs = " ".join(f"{k.removesuffix('_us')}={v:.1f}" for k, v in r.items()
                         if k.endswith("_us") and k.startswith(("fp8", "bf16", "rope")))
        print(f"    us: {knobs}")
    for r in report.get("prologue", []):
        c = r["best_config"]
        print(f"{r['shape']:<8} {r['m']:>3} {r['prologue']:<12} before {r['before_us']:7.1f} us  fused default "
              f"{r['default_us']:7.1f} us ({r['default_tb_s']:.2f} TB/s)  best {r['best_us']:7.1f} us "
              f"({r['best_tb_s']:.2f}) {c['BLOCK_N']}x{c['BLOCK_K']} w{c['num_warps']} split{c['SPLIT_K']}")
    for r in report.get("chain", []):
        cells = "  ".join(f"{k.removesuffix('_us_per_layer')} {v:.1f} us ({r[k.replace('us_per_layer', 'tb_s')]:.2f} TB/s)"
                          for k, v in r.items() if k.endswith("_us_per_layer"))
        print(f"chain M={r['m']} per layer: {cells}")
    for r in report.get("epilogue", []):
        c = r["interleaved_best_config"]
        print(f"{r['family']:<11} M={r['m']} gate_up {r['gate_up_us']:.1f} us, interleaved epilogue "
              f"{r['interleaved_gate_up_us']:.1f} (best {r['interleaved_best_us']:.1f}: {c['BLOCK_N']}x{c['BLOCK_K']} "
              f"s{c['num_stages']}); MLP us: " + " ".join(f"{key.removesuffix('_mlp_us')} {v:.1f}" for key, v in r.items()
                                               if key.endswith("_mlp_us")))
    for r in report.get("mixed", []):
        print(f"decode rows B={r['batch']} ctx={r['context']}: decode kernel {r['decode_tb_s']:.2f} TB/s, "
              f"prefill kernel {r['prefill_tb_s']:.2f} TB/s")


if __name__ == "__main__":
    main()
