"""The float8 KV cache format (EngineConfig.kv_cache_dtype "fp8"), as vLLM stores it.

K and V are stored as float8_e4m3fn: saturate(x / scale) computed in float32, where saturate
clamps to +-448 before the cast (a plain cast would turn larger values into NaN), and read
back as float(stored) * scale. One scale per tensor: KVScales, handed to the attention backend
by the runtime. A cache in the model's own dtype is a plain cast and ignores the scales.
"""

from typing import NamedTuple

import torch

FP8_KV_DTYPE = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8_KV_DTYPE).max  # 448.0
# heads of this width, read by many programs on sm_90+, have the decode kernel round q to float8 for q.K
# (paged_decode_attention's fp8_qk; rounds_q_to_fp8), and only there does --xqa-decode take the launch
FP8_QK_HEAD_DIM = 128


class KVScales(NamedTuple):
    """Per-tensor scales of a float8 KV cache: stored = saturate(x / k), read = float(stored) * k.

    The defaults, 1.0 for keys and values, are vLLM's without calibration (k_scale = v_scale =
    1.0): K and V of ordinary models lie well inside float8_e4m3fn's +-448. Calibrated scales (a
    checkpoint's k_scale / v_scale, or --calculate-kv-scales) come one per layer
    (AttentionBackend.bind_layer_scales).
    """

    k: float = 1.0
    v: float = 1.0


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype == FP8_KV_DTYPE


def quantize_kv(x: torch.Tensor, dtype: torch.dtype, scale: float) -> torch.Tensor:
    """x in a cache's element type: a plain cast, or for float8 saturate(x / scale) in float32."""
    if not is_fp8(dtype):
        return x.to(dtype)
    # Divide by a float32 tensor: a correctly rounded quotient, as store_kv's div_rn. (Dividing by a
    # Python float multiplies by its reciprocal on CUDA, which rounds differently near ties: 42.5 / 1.7
    # stored 26 where the exact quotient 24.99999 stores 24; measured on the H200, 2026-11-21.)
    divisor = torch.full((), scale, dtype=torch.float32, device=x.device)
    return (x.float() / divisor).clamp(-FP8_MAX, FP8_MAX).to(dtype)


def dequantize_kv(x: torch.Tensor, scale: float) -> torch.Tensor:
    """Cache elements as float32: float(x) * scale for float8, a plain cast otherwise."""
    return x.float() * scale if is_fp8(x.dtype) else x.float()
