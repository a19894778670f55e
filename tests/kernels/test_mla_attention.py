"""The Triton MLA kernels (kernels/mla_decode.py, kernels/mla_prefill.py) equal reference_mla_attention: decode
with any number of splits, prefill, chunked prefill over a cached prefix and mixed steps (one-token rows in the
prefill kernel or in the decode kernel's launch), at DeepSeek-V2-Lite's 16 heads x (512 + 64) and at the tiny
test configs' widths that are no power of two; and the triton backend's mla_forward (cache write included)
equals the torch backend's. The engine-level check is tests/kernels/test_triton_backend.py's."""

import pytest
import torch

pytest.importorskip("triton")

from graphllm.backends import TorchBackend  # noqa: E402
from graphllm.backends.triton_backend import TritonBackend  # noqa: E402
from graphllm.kernels.mla_decode import mla_decode_attention  # noqa: E402
from graphllm.kernels.mla_prefill import mla_prefill_attention  # noqa: E402
from graphllm.kernels.mla_reference import reference_mla_attention  # noqa: E402
from tests.kernels.conftest import DEVICE, LOW_DTYPE, assert_close, gpu_only, make_paged_kv, randn  # noqa: E402

SCALE = 192 ** -0.5  # V2-Lite's (nope + rope) ** -0.5

# (H, kv_lora_rank, rope, block_size, [(cached, new) per sequence])
PREFILL = [
    (16, 512, 64, 16, [(0, 5), (20, 7), (40, 1)]),  # V2-Lite: prefill, a chunk over a prefix, a decode
    (4, 32, 8, 8, [(0, 70), (37, 20), (99, 1), (0, 1), (5, 0)]),  # tiny "deepseek_v2": mixed, no tokens
    (96, 24, 16, 16, [(0, 9), (30, 4), (12, 1)]),  # widths no power of two; two head blocks, one partial
]
LARGE_PREFILL = [
    (16, 512, 64, 64, [(0, 600), (512, 300), (3000, 1), (0, 1), (1500, 64)]),  # the reference gathers T x M pages
    (128, 512, 64, 16, [(0, 200), (100, 77)] + [(900, 1)] * 8),  # V2's 128 heads
]
# (H, kv_lora_rank, rope, block_size, seq_lens)
DECODE = [
    (16, 512, 64, 16, [1, 16, 37]),  # one entry, one full block, a partial block
    (4, 32, 8, 8, [70, 5, 0, 129]),  # not multiples of the tile or block; seq_len 0: zeros
    (20, 24, 16, 16, [130, 33]),  # two head blocks, the second partial
]
LARGE_DECODE = [
    (16, 512, 64, 16, [1, 17, 1000, 4096, 333]),
    (128, 512, 64, 64, [513] * 40),
]


def make_latent_cache(seq_lens, block_size, entry_dim, dtype, seed):
    """kv_cache [1, NB, BS, 1, C] and block_tables [B, M]: make_paged_kv's, NaN in every slot no sequence owns."""
    kv_cache, block_tables = make_paged_kv(seq_lens, block_size, 1, entry_dim, dtype, seed)
    return kv_cache[:1].contiguous(), block_tables


def reference(q, kv_cache, block_tables, chunks, starts, kv_lora_rank):
    """reference_mla_attention in q's dtype; it sums over every gathered slot, so NaN (unowned) slots read as 0."""
    positions = torch.cat([torch.arange(cached, cached + new) for cached, new in chunks]).to(q.device)
    out = reference_mla_attention(q, kv_cache.nan_to_num(0.0), positions, block_tables, starts, SCALE, kv_lora_rank)
    return out.to(q.dtype)


def run_prefill(case, dtype, decode_kernel_min_seqs=1 << 30, seed=0):
    """decode_kernel_min_seqs 0: one-token rows in the decode kernel's launch; the default: in the prefill kernel."""
    num_heads, rank, rope, block_size, chunks = case
    seq_lens = [cached + new for cached, new in chunks]
    kv_cache, block_tables = make_latent_cache(seq_lens, block_size, rank + rope, dtype, seed)
    starts = torch.tensor([0] + [new for _, new in chunks]).cumsum(0).to(DEVICE)  # [B + 1]
    q = randn((int(starts[-1]), num_heads, rank + rope), dtype, seed + 1)
    got = mla_prefill_attention(q, kv_cache[0, :, :, 0], block_tables, torch.tensor(seq_lens, device=DEVICE), starts,
                                SCALE, rank, decode_kernel_min_seqs=decode_kernel_min_seqs)
    assert_close(got, reference(q, kv_cache, block_tables, chunks, starts, rank))


def run_decode(case, dtype, num_splits, seed=0):
    num_heads, rank, rope, block_size, seq_lens = case
    kv_cache, block_tables = make_latent_cache(seq_lens, block_size, rank + rope, dtype, seed)
    q = randn((len(seq_lens), num_heads, rank + rope), dtype, seed + 1)
    got = mla_decode_attention(q, kv_cache[0, :, :, 0], block_tables, torch.tensor(seq_lens, device=DEVICE), SCALE,
                               rank, num_splits=num_splits)
    live = [b for b, n in enumerate(seq_lens) if n > 0]
    expected = torch.zeros_like(got)  # a sequence with seq_len 0 gets zeros
    expected[live] = reference(q[live], kv_cache, block_tables[live], [(seq_lens[b] - 1, 1) for b in live],
                               torch.arange(len(live) + 1, device=DEVICE), rank)
    assert_close(got, expected)


@pytest.mark.parametrize("num_splits", [1, 3, None])
@pytest.mark.parametrize("case", DECODE)
def test_mla_decode_matches_reference(case, num_splits):
    run_decode(case, torch.float32, num_splits)


@pytest.mark.parametrize("case", DECODE[:2])
def test_mla_decode_matches_reference_half(case):
    run_decode(case, LOW_DTYPE, num_splits=2)


@pytest.mark.parametrize("decode_launch", [False, True])
@pytest.mark.parametrize("case", PREFILL)
def test_mla_prefill_matches_reference(case, decode_launch):
    run_prefill(case, torch.float32, decode_kernel_min_seqs=0 if decode_launch else 1 << 30)


@pytest.mark.parametrize("case", PREFILL[:2])
def test_mla_prefill_matches_reference_half(case):
    run_prefill(case, LOW_DTYPE)


def test_mla_decode_mixed_mode_computes_only_one_token_rows():
    """Mixed step: rows of sequences with one new token equal the reference, every other row of `out` is left as
    it was (NaN), through the split merge."""
    num_heads, rank, rope, block_size = 4, 32, 8, 8
    chunks = [(69, 1), (28, 12), (4, 1), (300, 0), (32, 1)]
    seq_lens = [cached + new for cached, new in chunks]
    kv_cache, block_tables = make_latent_cache(seq_lens, block_size, rank + rope, torch.float32, 0)
    starts = torch.tensor([0] + [new for _, new in chunks]).cumsum(0).to(DEVICE)
    q = randn((int(starts[-1]), num_heads, rank + rope), torch.float32, 1)
    out = torch.full((q.shape[0], num_heads, rank), float("nan"), device=DEVICE)
    got = mla_decode_attention(q, kv_cache[0, :, :, 0], block_tables, torch.tensor(seq_lens, device=DEVICE), SCALE,
                               rank, num_splits=3, query_start_loc=starts, out=out)
    assert got is out
    rows = starts[:-1][torch.tensor([new == 1 for _, new in chunks], device=DEVICE)]  # [3]
    assert_close(got[rows], reference(q, kv_cache, block_tables, chunks, starts, rank)[rows])
    others = torch.ones(q.shape[0], dtype=torch.bool, device=DEVICE)
    others[rows] = False
    assert got[others].isnan().all()


@pytest.mark.parametrize("steps", [(9,), (4, 3, 1, 1)], ids=["prefill", "chunk-then-decode"])
def test_triton_backend_mla_forward_matches_torch_backend(steps):
    """Both backends write the same entries at slot_mapping and return the same attention, step after step, for
    two sequences on non-contiguous blocks (decode steps go to the decode kernel: T == B)."""
    num_heads, rank, rope, block_size = 4, 32, 8, 4
    tables = torch.tensor([[5, 2, 7], [1, 6, 3]], device=DEVICE)
    caches = {name: torch.zeros(1, 8, block_size, 1, rank + rope, device=DEVICE) for name in ("torch", "triton")}
    start = 0
    for i, n in enumerate(steps):
        pos = torch.arange(start, start + n, device=DEVICE).repeat(2)  # [2n]: both sequences, same lengths
        slots = tables.repeat_interleave(n, 0).gather(1, (pos // block_size)[:, None])[:, 0] * block_size \
            + pos % block_size
        q, kv = randn((2 * n, num_heads, rank + rope), torch.float32, 2 * i), randn((2 * n, rank + rope),
                                                                                  torch.float32, 2 * i + 1)
        meta = (pos, slots, tables, torch.tensor([start + n] * 2, device=DEVICE),
                torch.tensor([0, n, 2 * n], device=DEVICE), SCALE, rank)
        want = TorchBackend().mla_forward(q, kv, caches["torch"], *meta)
        got = TritonBackend().mla_forward(q, kv, caches["triton"], *meta)
        assert_close(got, want)
        start += n
    assert torch.equal(caches["triton"], caches["torch"])


@gpu_only
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("case", LARGE_PREFILL)
def test_mla_prefill_matches_reference_large(case, dtype):
    run_prefill(case, dtype)
    run_prefill(case, dtype, decode_kernel_min_seqs=0)


@gpu_only
@pytest.mark.parametrize("num_splits", [1, 4, None])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("case", LARGE_DECODE)
def test_mla_decode_matches_reference_large(case, dtype, num_splits):
    run_decode(case, dtype, num_splits)
