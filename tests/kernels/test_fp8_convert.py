"""Which float8 conversion the attention kernels take (fp8_convert.kv_fp8_mode): none for a cache in q's dtype,
Triton's under the interpreter and for float32 queries, sm_89+'s cvt for float16 / bfloat16 queries on such a GPU.
The kernels' outputs under each are the decode / prefill / verify kernel tests' (on a GPU the bf16 and fp16 query
cases there take FP8_CVT); that the cvt path keeps the tile off byte-wise shared loads is test_sm90_compile's."""

import pytest

pytest.importorskip("triton")

import torch  # noqa: E402

from graphllm.kernels.fp8_convert import FP8_CVT, FP8_TRITON, kv_fp8_mode  # noqa: E402
from graphllm.kernels.kv_quant import FP8_KV_DTYPE  # noqa: E402
from tests.kernels.conftest import DEVICE  # noqa: E402


@pytest.mark.parametrize("q_dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_a_cache_in_the_models_dtype_needs_no_conversion(q_dtype):
    assert kv_fp8_mode(q_dtype, torch.zeros(2, dtype=q_dtype)) == 0


@pytest.mark.parametrize("q_dtype", [torch.bfloat16, torch.float16])
def test_cpu_tensors_take_tritons_conversion(q_dtype):
    """The interpreter runs no inline asm: CPU queries (every kernel test on a CPU) take Triton's conversion."""
    assert kv_fp8_mode(FP8_KV_DTYPE, torch.zeros(2, dtype=q_dtype)) == FP8_TRITON.value


@pytest.mark.skipif(DEVICE.type != "cuda", reason="needs a CUDA device")
@pytest.mark.parametrize("q_dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_gpu_queries_take_the_cvt_where_the_gpu_has_it(q_dtype):
    q = torch.zeros(2, dtype=q_dtype, device=DEVICE)
    new_enough = torch.cuda.get_device_capability(DEVICE) >= (8, 9)
    expected = FP8_CVT.value if new_enough and q_dtype != torch.float32 else FP8_TRITON.value
    assert kv_fp8_mode(FP8_KV_DTYPE, q) == expected
