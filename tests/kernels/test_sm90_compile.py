"""The attention, fused-MoE, fp8 and int4 matmul kernels compile for the H200 (sm_90), rope_store_kv's PTX rounds
each product as eager PyTorch does (no fma), and a float8 KV tile converted as loaded crosses shared memory in float16,
checked on any machine with Triton's NVIDIA backend: the interpreter, which runs the other kernel tests on CPU,
accepts code the compiler would reject (tests/kernels/sm90_compile.py)."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def nvidia_backend_present() -> bool:
    if importlib.util.find_spec("triton") is None or importlib.util.find_spec("triton.backends.nvidia") is None:
        return False
    import triton.backends.nvidia as nvidia
    return (Path(nvidia.__file__).parent / "bin" / "ptxas").exists()


@pytest.mark.skipif(not nvidia_backend_present(), reason="needs Triton's NVIDIA backend and its bundled ptxas")
def test_attention_kernels_compile_for_sm90_and_rope_keeps_eager_rounding():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-m", "tests.kernels.sm90_compile"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    # 12 + 2 soft-capped + 4 rotary split-kernel (bf16 and the two float8 conversions, fp8_convert.py; the rotary:
    # bf16 and converted as loaded, rope_decode.py) + 2 with the heads' RMSNorm first (NORM: weight, 1 + weight) + 6 over the head's halves (HALVES: split and direct, plain and
    # mixed, 128-key tiles, one with the rotary) + 4 with q.K in float8 (FP8_QK), 2 reduce, 6 + 2
    # soft-capped prefill, 2 rope variants, 6 + 2 verify, a windowed prefill and verify
    # + MLA: 4 split decode, 2 reduce, 2 prefill; + MoE: 2 routing, align, 4 x 2 expert GEMMs, k-sum; + fp8: 2
    # prologues, the pre-quantized path; + programmatic dependent launch: split, reduce, rope, 3 skinny_matmul,
    # fp8, int4 GEMV, RMSNorm, SwiGLU, SwiGLU to float8 (one pass and two), routing, align, 2 expert kernels, k-sum,
    # 2 skinny_matmul with the SwiGLU epilogue, one with SwiGLU in its prologue at 2-8 rows, 6 with row_sumsq's
    # statistics (at one row and at 2-8: two storing them, one reading them), 2 with the epilogue over an
    # interleaved gate_up, one storing its norm's output (shared_norm_prologue); + FP8_QK's P.V on a float16 wgmma
    # (PV_WGMMA); + the one-token router with its expert choice (moe_router.py), plain and under PDL; + the two
    # expert kernels with the down slabs fetched early (EARLY); + the prefill kernel's long-prompt tile (128 x 128, 8
    # warps) over bf16 and the two float8 conversions; + the decode split kernel under PDL: 4 with the rotary, 4 plain
    # and mixed (bf16, float8 converted as loaded); + the int4 GEMV in packed float16 (F16), 2 and 4 column parts;
    # + the int4 dot tiles at CONFIGS' 2-16-row tiles (int4_variants); + the int4 GEMV with SwiGLU in its finish
    # (F16 and float32) and with row_sumsq's int4 pair (two add + norm finishes, two 1 / rms); + int4_mma's
    # tensor-core kernel (int4_mma_variants: XSUM and not, split and not, float16, 16 rows), each with its mma.sync,
    # and the dequantize kernel from its layout
    assert run.stdout.count("cubin") == (33 + 4 + 3 + 8 + 2 + 8 + 12 + 3 + 17 + 2 + 2 + 1 + 6 + 2 + 1 + 1 + 2 + 2
                                         + 3 + 8 + 2 + 3 + 2 + 4 + 5 + 1), run.stdout
