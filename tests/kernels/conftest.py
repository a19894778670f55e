"""Kernel tests run on CUDA when present, else on CPU under Triton's interpreter (small shapes).

TRITON_INTERPRET must be set before any kernel is decorated: `triton.jit` reads it then. The
root conftest imports transformers, which imports triton, so by the time we run triton's own
jit'd helpers (tl.max, tl.cdiv, ...) are compiled-mode functions that the interpreter refuses
to call: re-decorate them by reloading their modules. Also shim one NumPy 2.4 incompatibility
of triton 3.6's interpreter (below). Test modules importorskip triton.
"""

import importlib
import importlib.util
import os
import sys

import torch


def _use_the_interpreter() -> None:
    os.environ["TRITON_INTERPRET"] = "1"
    stale = ["triton.language.standard", "triton.language.random", "triton.language"]
    stale += [n for n in sys.modules if n.startswith("graphllm.kernels.")]
    for name in [n for n in stale if n in sys.modules]:
        importlib.reload(sys.modules[name])
    from triton.runtime import interpreter
    patch_tensor = interpreter._patch_lang_tensor

    def patch_tensor_for_numpy_2_4(tensor, scope):
        # Scalars are shape-(1,) arrays there; NumPy 2.4 refuses int() of those, which breaks
        # `range(lo, hi)` over loaded bounds in triton 3.6's interpreter.
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    interpreter._patch_lang_tensor = patch_tensor_for_numpy_2_4


ON_GPU = torch.cuda.is_available()
if not ON_GPU and importlib.util.find_spec("triton") is not None:
    _use_the_interpreter()

import pytest  # noqa: E402

DEVICE = torch.device("cuda" if ON_GPU else "cpu")
# The interpreter runs numpy, which has no bfloat16 matmul: half precision is float16 there.
LOW_DTYPE = torch.bfloat16 if ON_GPU else torch.float16
TOLERANCE = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 2e-2}  # atol = rtol
gpu_only = pytest.mark.skipif(not ON_GPU, reason="heavier shape: too slow for the interpreter")


def assert_close(got: torch.Tensor, expected: torch.Tensor) -> None:
    assert got.dtype == expected.dtype and got.shape == expected.shape
    tol = TOLERANCE[got.dtype]
    torch.testing.assert_close(got.float(), expected.float(), atol=tol, rtol=tol)


def randn(shape, dtype: torch.dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen).to(device=DEVICE, dtype=dtype)


def make_paged_kv(seq_lens: list[int], block_size: int, num_kv_heads: int, head_dim: int,
                  dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A random kv_cache [2, NB, BS, Hkv, D] and block_tables [B, M] int64 for seq_lens.

    Each sequence gets blocks from a shuffled pool (so ids are not contiguous), its table is
    padded with 0 past its last block plus one spare column, and every slot no sequence owns
    (spare blocks, tails of last blocks) holds NaN, so reading one poisons the output.
    """
    gen = torch.Generator().manual_seed(seed)
    counts = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(counts) + 3
    pool = torch.randperm(num_blocks, generator=gen).tolist()
    tables = torch.zeros(len(seq_lens), max(counts, default=0) + 1, dtype=torch.int64)
    kv_cache = torch.full((2, num_blocks, block_size, num_kv_heads, head_dim), float("nan"))
    for b, (n, count) in enumerate(zip(seq_lens, counts)):
        blocks = torch.tensor([pool.pop() for _ in range(count)], dtype=torch.int64)
        tables[b, :count] = blocks
        slots = (blocks[:, None] * block_size + torch.arange(block_size)).flatten()[:n]
        kv_cache.view(2, -1, num_kv_heads, head_dim)[:, slots] = torch.randn(
            (2, n, num_kv_heads, head_dim), generator=gen)
    return kv_cache.to(device=DEVICE, dtype=dtype), tables.to(DEVICE)


def record_split_launches(monkeypatch) -> list[tuple[tuple, dict]]:
    """Every launch of paged_decode_attention's split kernel from now on, as (grid, keywords), still run."""
    import graphllm.kernels.paged_decode_attention as decode
    launches, real = [], decode._decode_split_kernel
    monkeypatch.setattr(decode, "_decode_split_kernel", type("Spy", (), {"__getitem__": lambda self, grid: (
        lambda *a, **kw: launches.append((grid, kw)) or real[grid](*a, **kw))})())
    return launches
