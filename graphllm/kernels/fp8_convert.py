"""How the attention kernels turn a float8 KV tile into float16 for their dots (their KV_FP8 constexpr).

Triton converts a float8 tile after the layout change its dots need: the pass that feeds tl.dot moves the
conversion behind the shared-memory round trip so that the narrower type crosses it, and the float8 tile is then
read back byte by byte. On sm_90 (Triton 3.9, offline SASS of the decode kernel at the 8B shape:
benchmarks/attention_sass.py --runtime-hints) that loop issued 702 instructions a KV tile, 108 of them LDS and 209
IMAD, against the bfloat16 cache's 437, though it reads half the bytes. `fp8_to_f16` converts where the tile is
loaded, four bytes at a time with sm_89+'s cvt.rn.f16x2.e4m3x2 (one instruction a pair), in an inline asm that
is not marked pure, which keeps Triton from moving it; the tile then crosses shared memory in float16 and is read
with ldmatrix like a bfloat16 tile: 392-400 instructions a tile for the decode kernel, 600-603 for the verify
kernel (from 1,019-1,042). The conversion is exact either way (e4m3 fits in float16).

KV_FP8 is 0 for a cache in q's dtype, FP8_TRITON for Triton's conversion (the interpreter, float32 queries, GPUs
before sm_89), FP8_CVT for this one (float16 or bfloat16 queries on sm_89+; the kernels' dots then run in
float16).
"""

import torch
import triton
import triton.language as tl

from graphllm.kernels.kv_quant import is_fp8

# KV_FP8's values; constexprs, so that the kernels can compare with them (the host takes .value)
FP8_TRITON = tl.constexpr(1)
FP8_CVT = tl.constexpr(2)


def fp8_dots_on(device: torch.device) -> bool:
    """tl.dot takes float8e4nv operands: sm_89+, and the interpreter."""
    return device.type != "cuda" or torch.cuda.get_device_capability(device) >= (8, 9)


def kv_fp8_mode(cache_dtype: torch.dtype, q: torch.Tensor) -> int:
    """The attention kernels' KV_FP8 for a cache of cache_dtype read by queries q."""
    if not is_fp8(cache_dtype):
        return 0
    if q.is_cuda and q.dtype in (torch.bfloat16, torch.float16) and torch.cuda.get_device_capability(q.device) >= (8, 9):
        return FP8_CVT.value
    return FP8_TRITON.value


@triton.jit
def fp8_to_f16(x):
    """A float8_e4m3fn tile read as bytes (uint8) -> the same values in float16, four bytes an asm call. Not
    pure: Triton may then neither move it behind the dot's layout change nor drop it."""
    return tl.inline_asm_elementwise(
        "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; cvt.rn.f16x2.e4m3x2 $0, lo; cvt.rn.f16x2.e4m3x2 $1, hi; }",
        "=r,=r,r", [x], dtype=tl.float16, is_pure=False, pack=4)
