"""Compile graphllm's attention (MLA included) and fused-MoE Triton kernels for sm_90 (the H200) with no GPU present.

    python -m tests.kernels.sm90_compile      # prints one line per kernel variant, exit 1 on a failure

With the GPU image's Triton first on the path (`pip install --no-deps --target DIR triton==3.6.0`, then
PYTHONPATH=DIR:.), the same builds run on the compiler the GPU has (2026-12-02: all 82 variants pass under 3.6).

Triton's interpreter (how CI runs the kernels) executes the Python with NumPy, so it accepts code
that the compiler rejects (a branch that changes a variable's type, an unsupported early exit).
Triton's own front end and its bundled ptxas need no GPU: this builds every constexpr variant the
launchers use down to a cubin for compute capability 9.0, with the launchers' options.
rope_store_kv must also keep eager PyTorch's rounding: its PTX may hold no fused multiply-add.
Run in its own process: the kernel tests' conftest puts the whole pytest session under the
interpreter (TRITON_INTERPRET=1).
"""

import itertools
import os
import re
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from graphllm.kernels import fp8_matmul, fused_moe, int4_matmul, mla_decode, mla_prefill, moe_align, moe_experts, moe_routing
from graphllm.kernels import int4_mma, moe_router
from graphllm.kernels import rms_norm, silu_and_mul, silu_and_mul_fp8, skinny_matmul
from graphllm.kernels import paged_decode_attention as decode
from graphllm.kernels.fp8_convert import FP8_CVT, FP8_TRITON
from graphllm.kernels import paged_prefill_attention as prefill
from graphllm.kernels import paged_verify_attention as verify
from graphllm.kernels import rope_store_kv as rope

SM90 = GPUTarget("cuda", 90, 32)
# the Llama-3-8B shape, bf16, in the engine's 16-token KV blocks (the attention kernels take block_size as a constexpr)
SHAPE = dict(GROUP=4, HEAD_DIM=128, BLOCK_D=128, BLOCK_N=64, PRECISION="tf32", block_size=16)


def pointer_types(kv_fp8: bool) -> dict[str, str]:
    cache = "*fp8e4nv" if kv_fp8 else "*bf16"
    return {"q_ptr": "*bf16", "k_cache_ptr": cache, "v_cache_ptr": cache, "block_tables_ptr": "*i64",
            "seq_lens_ptr": "*i64", "query_start_loc_ptr": "*i64", "out_ptr": "*bf16", "part_out_ptr": "*fp32",
            "part_lse_ptr": "*fp32", "scale_log2": "fp32", "v_scale": "fp32", "softcap_log2": "fp32"}


KV_MODES = (0, FP8_TRITON.value, FP8_CVT.value)  # the attention kernels' KV_FP8: bf16, float8 by Triton's or by one cvt a pair


def variants():
    """(kernel, argument types, constexprs, launch options) for each variant the launchers can ask for."""
    for direct, mixed, kv_fp8 in itertools.product((True, False), (True, False), KV_MODES):
        yield decode._decode_split_kernel, pointer_types(kv_fp8), dict(
            SHAPE, BLOCK_G=16, DIRECT=direct, MIXED=mixed, KV_FP8=kv_fp8, SOFTCAP=False), {}
    for direct in (True, False):  # Gemma 2's soft cap (bf16 cache)
        yield decode._decode_split_kernel, pointer_types(False), dict(
            SHAPE, BLOCK_G=16, DIRECT=direct, MIXED=False, KV_FP8=False, SOFTCAP=True), {}
    for direct, kv_fp8 in itertools.product((True, False), (0, FP8_CVT.value)):  # rotary + KV write inside
        types = dict(pointer_types(kv_fp8), k_new_ptr="*bf16", v_new_ptr="*bf16", cos_ptr="*bf16", sin_ptr="*bf16",
                     slot_ptr="*i64", k_store_scale="fp32", v_store_scale="fp32")
        yield decode._decode_split_kernel, types, dict(
            SHAPE, BLOCK_G=16, DIRECT=direct, MIXED=False, KV_FP8=kv_fp8, SOFTCAP=False, ROPE=True,
            EXACT_MUL=True), {}
        # under PDL (the engine's default on sm_90)
        yield decode._decode_split_kernel, types, dict(
            SHAPE, BLOCK_G=16, DIRECT=direct, MIXED=False, KV_FP8=kv_fp8, SOFTCAP=False, ROPE=True,
            EXACT_MUL=True, PDL=True), {"launch_pdl": True}
    for mixed, kv_fp8 in itertools.product((True, False), (0, FP8_CVT.value)):  # PDL over plain and mixed launches
        yield decode._decode_split_kernel, pointer_types(kv_fp8), dict(
            SHAPE, BLOCK_G=16, DIRECT=False, MIXED=mixed, KV_FP8=kv_fp8, SOFTCAP=False, PDL=True), {"launch_pdl": True}
    for unit_offset in (False, True):  # and the heads' RMSNorm first (Qwen3's q/k norms; Gemma 3's 1 + weight)
        types = dict(pointer_types(0), k_new_ptr="*bf16", v_new_ptr="*bf16", cos_ptr="*bf16", sin_ptr="*bf16",
                     slot_ptr="*i64", k_store_scale="fp32", v_store_scale="fp32", q_norm_ptr="*bf16",
                     k_norm_ptr="*bf16", norm_eps="fp32")
        yield decode._decode_split_kernel, types, dict(
            SHAPE, BLOCK_G=16, DIRECT=True, MIXED=False, KV_FP8=0, SOFTCAP=False, ROPE=True, EXACT_MUL=True,
            NORM=True, NORM_UNIT_OFFSET=unit_offset), {}
    # the dots over the two halves of the head (one_token_attention's HALVES; decode_tiling's for a float8 cache at
    # 32+ sequences, in plain and mixed steps), and 128-key tiles over 2 stages (one split, 128+ sequences)
    for direct, mixed in itertools.product((True, False), (True, False)):
        yield decode._decode_split_kernel, pointer_types(FP8_CVT.value), dict(
            SHAPE, BLOCK_G=16, DIRECT=direct, MIXED=mixed, KV_FP8=FP8_CVT.value, SOFTCAP=False, HALVES=True), {}
    yield decode._decode_split_kernel, pointer_types(FP8_CVT.value), dict(
        SHAPE, BLOCK_G=16, BLOCK_N=128, DIRECT=True, MIXED=False, KV_FP8=FP8_CVT.value, SOFTCAP=False,
        HALVES=True), {"num_stages": 2}
    # q.K in float8 with the keys on the MMA's M side (one_token_attention's FP8_QK): 64-key tiles over 3 stages,
    # 128-key tiles over 2, split and direct, and with the rotary inside
    for direct, block_n in itertools.product((True, False), (64, 128)):
        yield decode._decode_split_kernel, pointer_types(FP8_CVT.value), dict(
            SHAPE, BLOCK_G=16, BLOCK_N=block_n, DIRECT=direct, MIXED=False, KV_FP8=FP8_CVT.value, SOFTCAP=False,
            FP8_QK=True), {"num_stages": 3 if block_n == 64 else 2}
    yield decode._decode_split_kernel, pointer_types(FP8_CVT.value), dict(  # and P.V with the values on M (wgmma)
        SHAPE, BLOCK_G=16, BLOCK_N=64, DIRECT=True, MIXED=False, KV_FP8=FP8_CVT.value, SOFTCAP=False, FP8_QK=True,
        PV_WGMMA=True), {"num_stages": 2}
    rope_types = dict(pointer_types(FP8_CVT.value), k_new_ptr="*bf16", v_new_ptr="*bf16", cos_ptr="*bf16",
                      sin_ptr="*bf16", slot_ptr="*i64", k_store_scale="fp32", v_store_scale="fp32")
    yield decode._decode_split_kernel, rope_types, dict(  # and with the rotary inside (the engine's decode)
        SHAPE, BLOCK_G=16, DIRECT=True, MIXED=False, KV_FP8=FP8_CVT.value, SOFTCAP=False, ROPE=True, EXACT_MUL=True,
        HALVES=True), {}
    for mixed in (True, False):
        yield decode._decode_reduce_kernel, pointer_types(False), dict(
            HEAD_DIM=128, BLOCK_D=128, MIXED=mixed), {}
    for one_token_rows, kv_fp8, softcap in itertools.product((True, False), KV_MODES, (False, True)):
        if kv_fp8 and softcap:
            continue
        yield prefill._prefill_kernel, pointer_types(kv_fp8), dict(
            SHAPE, BLOCK_M=64, BLOCK_Q=16, BLOCK_G=16, ONE_TOKEN_ROWS=one_token_rows, KV_FP8=kv_fp8,
            SOFTCAP=softcap, NUM_KV_HEADS=8), {}
    for kv_fp8 in KV_MODES:  # long prompts' tile (prefill_tile: LONG_PROMPT_TILE, 128 rows x 128 keys, 8 warps)
        yield prefill._prefill_kernel, pointer_types(kv_fp8), dict(
            SHAPE, BLOCK_M=128, BLOCK_Q=32, BLOCK_G=16, BLOCK_N=128, ONE_TOKEN_ROWS=True, KV_FP8=kv_fp8,
            SOFTCAP=False, NUM_KV_HEADS=8), {"num_warps": 8}
    for windowed_kernel, extra in ((prefill._prefill_kernel, dict(BLOCK_M=64, BLOCK_Q=16, BLOCK_G=16,
                                                                   ONE_TOKEN_ROWS=False, NUM_KV_HEADS=8)),
                                   (verify._verify_split_kernel, dict(BLOCK_R=32, DIRECT=False))):
        yield windowed_kernel, pointer_types(0), dict(SHAPE, KV_FP8=0, SOFTCAP=False, WINDOWED=True, **extra), {}
    for direct, kv_fp8, softcap in itertools.product((True, False), KV_MODES, (False, True)):
        if kv_fp8 and softcap:
            continue
        yield verify._verify_split_kernel, pointer_types(kv_fp8), dict(  # k = 4: 5 tokens x group 4 -> 32 rows
            SHAPE, BLOCK_R=32, DIRECT=direct, KV_FP8=kv_fp8, SOFTCAP=softcap), {}
    for kv_fp8 in (False, True):
        types = dict(pointer_types(kv_fp8), k_ptr="*bf16", v_ptr="*bf16", cos_ptr="*bf16", sin_ptr="*bf16",
                     q_out_ptr="*bf16", slot_ptr="*i64", k_scale="fp32")
        yield rope._rope_store_kv_kernel, types, dict(HALF=64, BLOCK_H=8, BLOCK_HALF=64, KV_FP8=kv_fp8), \
            rope.LAUNCH_OPTIONS


# DeepSeek-V2(-Lite)
MLA_SHAPE = dict(KV_LORA_RANK=512, ROPE_DIM=64, BLOCK_L=512, BLOCK_R=64, PRECISION="tf32", block_size=16)


def mla_variants():
    """The MLA kernels as TritonBackend.mla_forward launches them at V2-Lite's shape (16 heads, 512 + 64, bf16):
    the decode split kernel (direct or split, plain or mixed), its merge (paged decode's reduce kernel at 512),
    and the prefill kernel with and without its one-token rows."""
    types = dict(pointer_types(False), cache_ptr="*bf16")
    for direct, mixed in itertools.product((True, False), repeat=2):
        yield mla_decode._mla_decode_split_kernel, types, dict(
            MLA_SHAPE, BLOCK_H=mla_decode.BLOCK_H, BLOCK_N=mla_decode.mla_block_n(576), DIRECT=direct,
            MIXED=mixed), {"num_stages": 2}
    for mixed in (True, False):
        yield decode._decode_reduce_kernel, types, dict(HEAD_DIM=512, BLOCK_D=512, MIXED=mixed), {}
    tiles = mla_prefill.mla_prefill_tiles(16, 576)
    options = {"num_warps": tiles.pop("num_warps"), "num_stages": tiles.pop("num_stages")}
    for one_token_rows in (True, False):
        yield mla_prefill._mla_prefill_kernel, types, dict(MLA_SHAPE, ONE_TOKEN_ROWS=one_token_rows, HEAD_BLOCKS=1,
                                                           **tiles), options


MOE_POINTERS = {"x_ptr": "*bf16", "w_ptr": "*bf16", "act_ptr": "*bf16", "ids_ptr": "*i32", "sorted_ids_ptr": "*i32",
                "expert_ids_ptr": "*i32", "num_padded_ptr": "*i32", "weights_ptr": "*fp32", "terms_ptr": "*bf16",
                "out_ptr": "*bf16", "counters_ptr": "*i32", "logits_ptr": "*bf16", "part_ptr": "*fp32",
                "counter_ptr": "*i32"}
ROUTER = dict(TOP_K=8, RENORMALIZE=True, E_POW2=128, K_POW2=8, SPLITS_POW2=32, BLOCK_K=64, LOW_BITS=16)  # Qwen3-30B-A3B's, one token


def moe_variants():
    """The fused MoE kernels as fused_moe.plan launches them, at Qwen3-30B-A3B's shape (E 128, k 8, bf16): one
    token, 8 tokens (scanning topk_ids) and a prefill (sorted rows), and Mixtral's E 8, k 2 at 64 tokens."""
    for renormalize in (True, False):
        yield moe_routing._topk_softmax_kernel, MOE_POINTERS, dict(TOP_K=8, RENORMALIZE=renormalize, E_POW2=128,
                                                                   K_POW2=8, LOW_BITS=16 if renormalize else 0), \
            {"num_warps": 1}  # bfloat16 logits' int32 keys; float32 logits' int64 keys
    yield moe_router._router_topk_kernel, MOE_POINTERS, ROUTER, {"num_warps": 4}
    yield moe_align._moe_align_kernel, MOE_POINTERS, dict(BLOCK_M=64, E_POW2=128, CHUNK=128), {"num_warps": 8}
    for tokens, top_k, experts in ((1, 8, 128), (8, 8, 128), (64, 2, 8), (4096, 8, 128)):
        config = fused_moe.plan(tokens, top_k, experts)
        pairs = tokens * top_k
        flags = (dict(SORTED=True, BY_EXPERT=False, PAIRS=1) if config["SORTED"] else
                 dict(SORTED=False, BY_EXPERT=experts <= pairs, PAIRS=triton.next_power_of_2(pairs)))
        common = dict(TOP_K=top_k, BLOCK_M=config["BLOCK_M"], DOT_FP32=False, PRECISION="tf32", **flags)
        options = {"num_warps": config["num_warps"], "num_stages": config["num_stages"]}
        yield moe_experts._gate_up_silu_kernel, MOE_POINTERS, dict(
            common, BLOCK_N=config["gate_up"][0], BLOCK_K=config["gate_up"][1]), options
        yield moe_experts._down_weighted_kernel, MOE_POINTERS, dict(
            common, BLOCK_N=config["down"][0], BLOCK_K=config["down"][1], BLOCK_T=fused_moe.SUM_TOKENS), options
    yield moe_experts._sum_over_k_kernel, MOE_POINTERS, dict(TOP_K=8, BLOCK_T=fused_moe.SUM_TOKENS,
                                                             BLOCK_N=fused_moe.SUM_COLUMNS), {}


def fp8_variants():
    """The fp8 matmul as fp8_prologue_matmul launches it at one row (16-row tile, weight on the MMA's M side, K
    split): the add_rms_norm and silu_mul prologues with dynamic row scales; and the pre-quantized path."""
    types = {"x_ptr": "*bf16", "x_scale_ptr": "*fp32", "w_ptr": "*fp8e4nv", "w_scale_ptr": "*fp32",
             "bias_ptr": "*bf16", "out_ptr": "*bf16", "partial_ptr": "*fp32", "count_ptr": "*i32", "res_ptr": "*bf16",
             "norm_w_ptr": "*bf16", "new_res_ptr": "*bf16", "eps": "fp32"}
    tile = dict(HAS_BIAS=False, BLOCK_M=16, BLOCK_N=64, BLOCK_K=256, SPLIT_K=2, GROUP_M=8, SWAP_AB=True, EVEN_N=True,
                EVEN_K=True, FP8_DOT=True, UNIT_OFFSET=False, ROWS=1, PRE_K=4096)
    for prologue in (fp8_matmul.PROLOGUES["add_rms_norm"], fp8_matmul.PROLOGUES["silu_mul"]):
        yield fp8_matmul._fp8_matmul_kernel, types, dict(tile, X_MODE=0, PROLOGUE=prologue), {"num_stages": 4}
    yield fp8_matmul._fp8_matmul_kernel, dict(types, x_ptr="*fp8e4nv"), dict(tile, X_MODE=2, PROLOGUE=0, ROWS=16), \
        {"num_stages": 4}


def int4_variants():
    """The int4 dot-tile kernel (2-16 rows) at CONFIGS' tiles, G = 128 (the step's group by a shift): o_proj's and
    qkv's at 16 rows (64 x 128, nibble pairs, the weight on the MMA's M side), down's at 2-16 rows (128 x 128),
    gate_up's at 2, 8 and 16 rows (128 x 64)."""
    types = {"x_ptr": "*bf16", "qw_ptr": "*i32", "scales_ptr": "*bf16", "zeros_ptr": "*bf16", "bias_ptr": "*bf16",
             "out_ptr": "*bf16", "partial_ptr": "*fp32", "count_ptr": "*i32"}
    for block_n, block_k, pairs, swap_ab, split_k, stages in ((64, 128, 1, True, 4, 4), (128, 128, 0, False, 8, 4),
                                                              (128, 64, 0, False, 4, 5)):
        yield int4_matmul._int4_matmul_kernel, types, dict(
            HAS_BIAS=False, BLOCK_M=16, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split_k, GROUP_M=8, SWAP_AB=swap_ab,
            EVEN_N=True, EVEN_K=True, ONE_GROUP=True, PRECISION="tf32", ROW_SUM=False, PAIRS=pairs,
            NUM_STAGES=stages, GROUP_SHIFT=7), {"num_stages": stages}


def int4_mma_variants():
    """int4_mma's tensor-core kernel (1-16 rows, opt-in): bfloat16 and float16 x, the zero point per weight pair and
    from x's sums (XSUM), split and not, two 8-row tiles of x (TILES 2), under PDL; and its dequantize kernel."""
    types = {"x_ptr": "*bf16", "w_ptr": "*i32", "scales_ptr": "*bf16", "zeros_ptr": "*bf16", "bias_ptr": "*bf16",
             "out_ptr": "*bf16", "partial_ptr": "*fp32", "count_ptr": "*i32"}
    f16 = {**types, "x_ptr": "*fp16", "scales_ptr": "*fp16", "zeros_ptr": "*fp16", "bias_ptr": "*fp16",
           "out_ptr": "*fp16"}
    for xsum, warps, split, dtypes, is_f16, tiles in ((True, 4, 8, types, False, 1), (False, 4, 8, types, False, 1),
                                                     (True, 8, 1, types, False, 1), (True, 4, 4, f16, True, 1),
                                                     (True, 4, 8, types, False, 2)):
        yield int4_mma._int4_mma_kernel, dtypes, dict(HAS_BIAS=True, WARPS=warps, SPLIT_K=split, F16=is_f16,
                                                      XSUM=xsum, TILES=tiles, PDL=True), {
            "num_warps": warps, "num_stages": 1, "launch_pdl": True}
    yield int4_mma._int4_mma_dequant_kernel, {"w_ptr": "*i32", "scales_ptr": "*bf16", "zeros_ptr": "*bf16",
                                             "out_ptr": "*bf16"}, {}, {"num_warps": 4}


def pdl_variants():
    """The decode step's kernels as they launch under programmatic dependent launch (EngineConfig.enable_pdl: PDL
    and Triton's launch_pdl): the decode linear at one row with and without a norm prologue and the 16-row tile,
    rope + KV store, decode attention's split and reduce kernels, the quantized linears at one row, the row kernels
    (RMSNorm, SwiGLU, SwiGLU into float8) and the MoE kernels of one token (routing, both expert kernels; the sorted
    path's align and k-sum)."""
    pdl = {"launch_pdl": True}
    rows = {"x_ptr": "*bf16", "res_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16", "h_ptr": "*bf16", "eps": "fp32"}
    yield rms_norm._rms_norm_kernel, rows, dict(HAS_RESIDUAL=True, UNIT_OFFSET=False, BLOCK_D=4096, PDL=True), \
        {"num_warps": 8, **pdl}
    yield silu_and_mul._silu_and_mul_kernel, {"x_ptr": "*bf16", "out_ptr": "*bf16"}, dict(
        BLOCK=1024, GELU_TANH=False, PDL=True), {"num_warps": 4, **pdl}
    for one_pass in (True, False):  # Llama-3-8B's 14336 columns in one pass; wider rows in two
        yield silu_and_mul_fp8._silu_and_mul_fp8_kernel, {"x_ptr": "*bf16", "out_ptr": "*fp8e4nv", "scale_ptr": "*fp32"}, \
            dict(BLOCK=16384, ONE_PASS=one_pass, PDL=True), {"num_warps": 16, **pdl}
    yield moe_routing._topk_softmax_kernel, MOE_POINTERS, dict(TOP_K=8, RENORMALIZE=True, E_POW2=128, K_POW2=8,
                                                               LOW_BITS=16, PDL=True), {"num_warps": 1, **pdl}
    yield moe_router._router_topk_kernel, MOE_POINTERS, dict(ROUTER, PDL=True), {"num_warps": 4, **pdl}
    yield moe_align._moe_align_kernel, MOE_POINTERS, dict(BLOCK_M=64, E_POW2=128, CHUNK=128, PDL=True), \
        {"num_warps": 8, **pdl}
    config = fused_moe.plan(1, 8, 128)
    common = dict(TOP_K=8, BLOCK_M=config["BLOCK_M"], DOT_FP32=False, PRECISION="tf32", SORTED=False, BY_EXPERT=False,
                  PAIRS=8, PDL=True)
    options = {"num_warps": config["num_warps"], "num_stages": config["num_stages"], **pdl}
    yield moe_experts._gate_up_silu_kernel, MOE_POINTERS, dict(
        common, BLOCK_N=config["gate_up"][0], BLOCK_K=config["gate_up"][1]), options
    yield moe_experts._down_weighted_kernel, MOE_POINTERS, dict(
        common, BLOCK_N=config["down"][0], BLOCK_K=config["down"][1], BLOCK_T=fused_moe.SUM_TOKENS), options
    yield moe_experts._gate_up_silu_kernel, MOE_POINTERS, dict(  # and with the down slabs fetched early
        common, BLOCK_N=config["gate_up"][0], BLOCK_K=config["gate_up"][1], EARLY=True), options
    yield moe_experts._down_weighted_kernel, MOE_POINTERS, dict(
        common, BLOCK_N=config["down"][0], BLOCK_K=config["down"][1], BLOCK_T=fused_moe.SUM_TOKENS, EARLY=True), options
    yield moe_experts._sum_over_k_kernel, MOE_POINTERS, dict(TOP_K=8, BLOCK_T=fused_moe.SUM_TOKENS,
                                                             BLOCK_N=fused_moe.SUM_COLUMNS, PDL=True), pdl
    yield decode._decode_split_kernel, pointer_types(False), dict(
        SHAPE, BLOCK_G=16, DIRECT=False, MIXED=False, KV_FP8=False, SOFTCAP=False, PDL=True), pdl
    yield decode._decode_reduce_kernel, pointer_types(False), dict(HEAD_DIM=128, BLOCK_D=128, MIXED=False,
                                                                   PDL=True), pdl
    types = dict(pointer_types(False), k_ptr="*bf16", v_ptr="*bf16", cos_ptr="*bf16", sin_ptr="*bf16",
                 q_out_ptr="*bf16", slot_ptr="*i64", k_scale="fp32")
    yield rope._rope_store_kv_kernel, types, dict(HALF=64, BLOCK_H=8, BLOCK_HALF=64, KV_FP8=False, PDL=True), \
        {**rope.LAUNCH_OPTIONS, **pdl}
    # the quantized decode linears at one row: fp8's pre-quantized 16-row tile, the int4 GEMV
    fp8_types = {"x_ptr": "*fp8e4nv", "x_scale_ptr": "*fp32", "w_ptr": "*fp8e4nv", "w_scale_ptr": "*fp32",
                 "bias_ptr": "*bf16", "out_ptr": "*bf16", "partial_ptr": "*fp32", "count_ptr": "*i32", "res_ptr": "*bf16",
                 "norm_w_ptr": "*bf16", "new_res_ptr": "*bf16", "eps": "fp32"}
    yield fp8_matmul._fp8_matmul_kernel, fp8_types, dict(
        X_MODE=2, HAS_BIAS=False, BLOCK_M=16, BLOCK_N=64, BLOCK_K=256, SPLIT_K=1, GROUP_M=8, SWAP_AB=True, EVEN_N=True,
        EVEN_K=True, FP8_DOT=True, PROLOGUE=0, UNIT_OFFSET=False, ROWS=16, PRE_K=256, PDL=True), {"num_stages": 4, **pdl}
    int4_types = {"x_ptr": "*bf16", "qw_ptr": "*i32", "scales_ptr": "*bf16", "zeros_ptr": "*bf16", "bias_ptr": "*bf16",
                  "out_ptr": "*bf16", "partial_ptr": "*fp32", "count_ptr": "*i32"}
    yield int4_matmul._int4_gemv_kernel, int4_types, dict(
        HAS_BIAS=False, BLOCK_N=128, BLOCK_K=128, SPLIT_K=4, EVEN_N=True, NUM_STAGES=1, PREFETCH=True, PDL=True,
        GROUP_SHIFT=7), {"num_stages": 1, **pdl}  # g128: the group by a shift
    # ... and with packed float16 arithmetic (F16: word rows in pairs, its PTX), in 2 and 4 column parts
    for block_n, parts in ((128, 2), (256, 4)):
        yield int4_matmul._int4_gemv_kernel, int4_types, dict(
            HAS_BIAS=False, BLOCK_N=block_n, BLOCK_K=128, SPLIT_K=16, EVEN_N=True, NUM_STAGES=1, PREFETCH=False,
            PDL=True, F16=1, PARTS=parts, GROUP_SHIFT=7), {"num_stages": 1, **pdl}
    # ... and gate_up's with SwiGLU in its split-K finish (linear_epilogue over int4), packed float16 and float32
    for f16 in (1, 0):
        yield int4_matmul._int4_gemv_kernel, int4_types, dict(
            HAS_BIAS=False, BLOCK_N=128, BLOCK_K=128, SPLIT_K=4, EVEN_N=True, NUM_STAGES=1, PREFETCH=False,
            PDL=True, F16=f16, PARTS=2, GROUP_SHIFT=7, EPILOGUE=1), {"num_stages": 1, **pdl}
    # ... and with row_sumsq's int4 pair: o_proj's and down's (PREFETCH) add + norm finish, qkv's 1 / rms, gate_up's
    # 1 / rms with its SwiGLU finish
    fold_types = {**int4_types, "res_ptr": "*bf16", "norm_w_ptr": "*bf16", "h_ptr": "*bf16", "sumsq_ptr": "*fp32",
                  "eps": "fp32"}
    for prefetch, f16, epilogue, norm, groups in ((False, 0, 0, 1, 0), (True, 0, 0, 1, 0), (False, 0, 0, 0, 256),
                                                  (False, 1, 1, 0, 256)):
        yield int4_matmul._int4_gemv_kernel, fold_types, dict(
            HAS_BIAS=False, BLOCK_N=128, BLOCK_K=128, SPLIT_K=4, EVEN_N=True, NUM_STAGES=1, PREFETCH=prefetch,
            PDL=True, F16=f16, PARTS=2, GROUP_SHIFT=7, EPILOGUE=epilogue, NORM=norm, RSTD_GROUPS=groups), \
            {"num_stages": 1, **pdl}
    types = {"x_ptr": "*bf16", "res_ptr": "*bf16", "norm_w_ptr": "*bf16", "new_res_ptr": "*bf16", "w_ptr": "*bf16",
             "bias_ptr": "*bf16", "out_ptr": "*bf16", "partial_ptr": "*fp32", "count_ptr": "*i32", "eps": "fp32"}
    tile = dict(UNIT_OFFSET=False, HAS_BIAS=False, BLOCK_N=16, BLOCK_K=512, SPLIT_K=1, EVEN_N=True, EVEN_K=True,
                PRECISION="tf32", PDL=True)
    for prologue, block_m in ((skinny_matmul.PROLOGUES["add_rms_norm"], 1), (0, 1), (0, 16)):
        yield skinny_matmul._skinny_matmul_kernel, types, dict(tile, PROLOGUE=prologue, BLOCK_M=block_m), \
            {"num_stages": 4, "launch_pdl": True}
    # SwiGLU in down_proj's prologue at 2-8 rows (the 8B down's CONFIGS tile, 64 x 256 in 2 K splits; the engine
    # takes it at one row only since s28, but silu_mul_matmul still offers it)
    yield skinny_matmul._skinny_matmul_kernel, types, dict(
        tile, PROLOGUE=skinny_matmul.PROLOGUES["silu_mul"], BLOCK_M=16, BLOCK_N=64, BLOCK_K=256, SPLIT_K=2), \
        {"num_stages": 4, "launch_pdl": True}
    # row_sumsq at 2-8 rows: o_proj (32-column tiles) and the 8B down (SwiGLU prologue, 2 K splits) store the next
    # norm's row statistics; gate_up / qkv (64-column tiles) normalise with them (K 4096: 256 groups)
    sumsq_types = dict(types, sumsq_ptr="*fp32")
    # (at one row: o_proj's and down's 32-column tiles in 4 K splits, and the fused qkv's 16 x 512 reading them)
    silu, norm = skinny_matmul.PROLOGUES["silu_mul"], skinny_matmul.PROLOGUES["add_rms_norm"]
    for block_m, prologue, block_n, block_k, split_k, sumsq, groups in (
            (16, 0, 32, 256, 1, 1, 1), (16, silu, 64, 256, 2, 1, 1), (16, norm, 64, 256, 1, 2, 256),
            (1, 0, 32, 256, 4, 1, 1), (1, silu, 32, 256, 4, 1, 1), (1, norm, 16, 512, 1, 2, 256)):
        yield skinny_matmul._skinny_matmul_kernel, sumsq_types, dict(
            tile, PROLOGUE=prologue, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split_k, SUMSQ=sumsq,
            GROUPS=groups), {"num_stages": 4, "launch_pdl": True}
    # the SwiGLU epilogue over [gate; up] (linear_epilogue): batch 1's gate_up with its norm, 8 rows' dot tiles
    for prologue, block_m, block_n in ((skinny_matmul.PROLOGUES["add_rms_norm"], 1, 8), (0, 16, 32)):
        yield skinny_matmul._skinny_matmul_kernel, types, dict(
            tile, PROLOGUE=prologue, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=256,
            EPILOGUE=skinny_matmul.EPILOGUES["silu_mul"]), {"num_stages": 4, "launch_pdl": True}
    # ...and over the interleaved weight: one tile of rows for both halves (one row with its norm; 8 rows' dots)
    for prologue, block_m, block_n in ((skinny_matmul.PROLOGUES["add_rms_norm"], 1, 16), (0, 16, 64)):
        yield skinny_matmul._skinny_matmul_kernel, types, dict(
            tile, PROLOGUE=prologue, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=256,
            EPILOGUE=skinny_matmul.EPILOGUES["silu_mul"], INTERLEAVED=True), {"num_stages": 4, "launch_pdl": True}


    # a norm read by the router and the experts (shared_norm_prologue): the one-row launch that also stores it (the
    # router's 32-column tiles in 4 K splits, default_config's at K >= 2N)
    yield skinny_matmul._skinny_matmul_kernel, dict(types, normed_ptr="*bf16"), dict(
        tile, PROLOGUE=skinny_matmul.PROLOGUES["add_rms_norm"], BLOCK_M=1, BLOCK_N=32, BLOCK_K=256, SPLIT_K=4,
        STORE_NORMED=True), {"num_stages": 4, "launch_pdl": True}


def with_defaults(kernel: triton.JITFunction, constexprs: dict) -> dict:
    """constexprs plus the kernel's own defaults for the constexpr parameters they leave out (ASTSource applies
    none of its own: a left-out one would compile as a runtime int32)."""
    return {**{p.name: p.default for p in kernel.params if p.is_constexpr and p.has_default}, **constexprs}


def runtime_hints(kernel: triton.JITFunction, types: dict[str, str], constexprs: dict) -> dict:
    """ASTSource attrs: tt.divisibility 16 on every pointer and on every integer argument the kernel specializes, as
    Triton's launcher gives them at the 8B shapes (torch's allocations are 16-byte aligned; every stride, size and
    group there is a multiple of 16). Without them no load vectorizes and the layouts differ from the GPU's."""
    skip = set(kernel.do_not_specialize) | set(constexprs)
    return {(i,): [["tt.divisibility", 16]] for i, name in enumerate(kernel.arg_names)
            if name not in skip and (types.get(name, "i32").startswith("*") or types.get(name, "i32") == "i32")}


def compile_sm90(kernel: triton.JITFunction, types: dict[str, str], constexprs: dict, options: dict,
                 hints: bool = False) -> dict:
    """The compiled kernel's assembly (cubin, ptx, ...); arguments not typed are int32 scalars. hints: with
    runtime_hints (the build the GPU runs at the 8B shapes; without, a build that every shape can run)."""
    constexprs = with_defaults(kernel, constexprs)
    signature = {name: "constexpr" if name in constexprs else types.get(name, "i32") for name in kernel.arg_names}
    attrs = runtime_hints(kernel, types, constexprs) if hints else None
    compiled = triton.compile(ASTSource(kernel, signature, constexprs, attrs), target=SM90,
                              options={"num_warps": 4, "num_stages": 3, **options})
    return compiled.asm


def check(kernel: triton.JITFunction, types: dict[str, str], constexprs: dict, options: dict) -> str:
    """A line on the variant; raises where it does not compile, where rope_store_kv fuses a product or the
    decode kernel's rotary multiplies otherwise than by its asm."""
    asm = compile_sm90(kernel, types, constexprs, options)
    fused = len(re.findall(r"^\s*fma\.", asm["ptx"], re.M))
    if kernel is rope._rope_store_kv_kernel and fused:
        raise AssertionError(f"{fused} fma instructions: a product's rounding is skipped")
    if constexprs.get("ROPE") and ("mul.rn.f32" not in asm["ptx"] or re.search(r"(fma|mul)\.rn\.bf16", asm["ptx"])):
        # the decode kernel's rotary: every product an opaque f32 multiply, none a bfloat16 one nor fused
        raise AssertionError("the rotary's products are not the asm mul.rn.f32 (rope_decode.py)")
    if constexprs.get("KV_FP8") == FP8_CVT.value and kernel is not prefill._prefill_kernel:
        # converted as loaded: the tile crosses shared memory in float16, not byte by byte (fp8_convert.py; Triton's
        # own conversion reads it back with 96 byte loads in the decode kernel)
        byte_loads = len(re.findall(r"ld\.shared(\.v\d)?\.[bu]8", asm["ptx"]))
        if byte_loads or "ldmatrix" not in asm["ptx"]:
            raise AssertionError(f"the float8 tile is read back from shared memory by {byte_loads} byte loads")
    if constexprs.get("FP8_QK") and ".e4m3.e4m3" not in asm["ptx"]:
        # the keys on the MMA's M side: sm_90's float8 wgmma reads the key tile from shared memory
        raise AssertionError("FP8_QK: no float8 MMA (wgmma ... .e4m3.e4m3) in the PTX")
    if constexprs.get("PV_WGMMA") and not re.search(r"wgmma\.mma_async\S*\.f16\.f16", asm["ptx"]):
        # P.V with the values on the M side: a float16 wgmma, not mma.sync
        raise AssertionError("PV_WGMMA: no float16 wgmma in the PTX")
    if kernel is int4_mma._int4_mma_kernel and "mma.sync.aligned.m16n8k16" not in asm["ptx"]:
        raise AssertionError("int4_mma: no mma.sync in the PTX")
    if constexprs.get("PDL"):  # the wait, and the weight prefetch before it (at one row: BLOCK_K covers a line)
        ptx = asm["ptx"]
        waits, triggers = ptx.count("griddepcontrol.wait"), ptx.count("griddepcontrol.launch_dependents")
        prefetches = ptx.count("prefetch.global.L2")
        streams = (skinny_matmul._skinny_matmul_kernel, fp8_matmul._fp8_matmul_kernel, int4_matmul._int4_gemv_kernel,
                   moe_router._router_topk_kernel, int4_mma._int4_mma_kernel)
        if waits != 1 or triggers != 1 or (kernel in streams and not prefetches):
            raise AssertionError(f"PDL: {waits} griddepcontrol.wait, {triggers} launch_dependents, {prefetches} "
                                 "prefetch.global.L2 in the PTX")
    return f"cubin {len(asm['cubin'])} bytes, {fused} fma"


def main() -> int:
    assert os.environ.get("TRITON_INTERPRET") != "1", "run outside Triton's interpreter"
    failed = 0
    for kernel, types, constexprs, options in (*variants(), *mla_variants(), *moe_variants(), *fp8_variants(),
                                               *int4_variants(), *int4_mma_variants(), *pdl_variants()):
        flags = {k: v for k, v in constexprs.items() if k in ("DIRECT", "MIXED", "ONE_TOKEN_ROWS", "KV_FP8", "SOFTCAP",
                                                               "WINDOWED", "ROPE", "HALVES",
                                                               "SORTED", "BY_EXPERT", "PAIRS", "BLOCK_M", "RENORMALIZE",
                                                               "X_MODE", "PROLOGUE", "EPILOGUE", "SUMSQ", "PDL",
                                                               "NORM", "RSTD_GROUPS", "F16", "PREFETCH", "XSUM",
                                                               "WARPS", "TILES")}
        try:
            print(f"{kernel.__name__} {flags}: {check(kernel, types, constexprs, options)}", flush=True)
        except Exception as error:  # noqa: BLE001 - report every variant, then fail
            failed += 1
            print(f"{kernel.__name__} {flags}: FAILED {type(error).__name__}: {error}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
