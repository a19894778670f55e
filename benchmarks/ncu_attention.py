"""Hardware counters of the paged decode attention kernel at the Llama-3-8B heads, for `gpu_run.sh ncu-attention`.

    python benchmarks/ncu_attention.py launch          # the launches ncu profiles (run under ncu)
    python benchmarks/ncu_attention.py table CSV       # ncu's CSV -> one line per launch (ncu_table.py)
    python benchmarks/ncu_attention.py count|metrics   # what gpu_run.sh passes to ncu

The question it answers (twenty-first session, benchmarks/RESULTS.md): at 128-256 sequences a float8 cache's
decode takes as long as bf16's though it reads half the bytes, and neither its conversion, the pipeline's
depth, 128-key tiles, the grid's order nor contiguous pages per head moved it by more than 8%. Its counters
beside bf16's say which of memory, issue, barriers or occupancy bounds it.
"""

import torch

from graphllm.kernels.paged_decode_attention import paged_decode_attention
from ncu_table import main

HQ, HKV, HEAD_DIM, BLOCK_SIZE = 32, 8, 128, 16
# (name, sequences, context, cache dtype, paged_decode_attention keywords)
CASES = [("bf16", 256, 1024, torch.bfloat16, {}),
         ("fp8 (decode_tiling: halves, 128 keys, 2 stages)", 256, 1024, torch.float8_e4m3fn, {}),
         ("fp8 s22 (128 keys, 3 stages)", 256, 1024, torch.float8_e4m3fn,
          dict(block_n=128, num_stages=3, head_halves=False)),
         ("fp8 halves, 64 keys", 256, 1024, torch.float8_e4m3fn, dict(head_halves=True, block_n=64, num_stages=3)),
         ("fp8 q.K in float8, 64 keys, 2 stages", 256, 1024, torch.float8_e4m3fn,
          dict(fp8_qk=True, block_n=64, num_stages=2)),
         ("fp8 q.K in float8, 128 keys, 2 stages", 256, 1024, torch.float8_e4m3fn,
          dict(fp8_qk=True, block_n=128, num_stages=2)),
         ("bf16", 32, 1024, torch.bfloat16, {}), ("fp8", 32, 1024, torch.float8_e4m3fn, {}),
         ("fp8 q.K in float8", 32, 1024, torch.float8_e4m3fn, dict(fp8_qk=True, block_n=64, num_stages=2))]


def inputs(batch: int, ctx: int, dtype: torch.dtype) -> tuple:
    """(k_cache, v_cache, block_tables over shuffled pages, seq_lens, q) of one layer."""
    pages = -(-ctx // BLOCK_SIZE)
    cache = torch.randn(2, batch * pages, BLOCK_SIZE, HKV, HEAD_DIM, device="cuda", dtype=torch.bfloat16).to(dtype)
    tables = torch.randperm(batch * pages, device="cuda").view(batch, pages)
    lens = torch.full((batch,), ctx, device="cuda", dtype=torch.int64)
    q = torch.randn(batch, HQ, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    return cache[0], cache[1], tables, lens, q


def calls() -> list:
    torch.manual_seed(0)
    out = []
    for _, batch, ctx, dtype, knobs in CASES:
        k, v, tables, lens, q = inputs(batch, ctx, dtype)
        out.append(lambda k=k, v=v, t=tables, n=lens, q=q, kw=knobs:
                   paged_decode_attention(q, k, v, t, n, HEAD_DIM ** -0.5, 0, **kw))
    return out


if __name__ == "__main__":
    main(calls, [f"{name} B={batch} ctx={ctx}" for name, batch, ctx, _, _ in CASES])
