"""Grid dependency control inside graphllm's kernels: their side of programmatic dependent launch (launch.py).

A kernel launched with PDL (its PDL constexpr, from launch.pdl_launch) begins with one of these, before it reads
anything an earlier kernel wrote or writes anything:

    dependent_start()        let the next kernel launch, then wait for the kernels before (rope + KV store,
                             decode attention, the row kernels, the MoE kernels: nothing of theirs is worth
                             fetching before
                             their inputs exist; the experts' weights depend on the routing)
    programmatic_start(...)  the same around an L2 prefetch of the program's first weight step (the [N, K]
                             decode linears, bf16 and fp8: the weights are the model's, no kernel writes them;
                             the int4 GEMV does the same inline over its [K/8, N] words)
"""

import triton
import triton.language as tl


@triton.jit
def prefetch_l2(ptrs):
    """prefetch.global.L2 of every address in ptrs (a hint: no value, no fault), e.g. one per 128-byte line."""
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];", "=r,l", [ptrs], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def dependent_start():
    """Let the next kernel launch once every program of this one has started (it runs up to its own wait while
    this one works), then wait until the kernels before have completed and their writes are visible."""
    tl.extra.cuda.gdc_launch_dependents()
    tl.extra.cuda.gdc_wait()


@triton.jit
def programmatic_start(w_ptr, offs_n, N, k_lo, stride_wn, BLOCK_K: tl.constexpr):
    """dependent_start around a prefetch into L2 of this program's first K step of an [N, K] weight (rows
    offs_n, columns k_lo + [0, BLOCK_K)), one address per 128-byte line."""
    tl.extra.cuda.gdc_launch_dependents()
    LINE: tl.constexpr = 1024 // w_ptr.dtype.element_ty.primitive_bitwidth  # elements in 128 bytes
    if BLOCK_K >= LINE:
        rows = tl.minimum(offs_n, N - 1).to(tl.int64)  # past N: row N - 1 again, never out of bounds
        prefetch_l2(w_ptr + rows[:, None] * stride_wn + (k_lo + LINE * tl.arange(0, BLOCK_K // LINE))[None, :])
    tl.extra.cuda.gdc_wait()
