"""Grid dependency control inside graphllm's kernels: their side of programmatic dependent launch (launch.py).

A kernel launched with PDL (its PDL constexpr, from launch.pdl_launch) begins with one of these, before it reads
anything an earlier kernel wrote or writes anything:

    dependent_start()             let the next kernel launch, then wait for the kernels before (rope + KV store,
                                  decode attention, the row kernels, the MoE kernels: nothing of theirs is worth
                                  fetching before their inputs exist; the experts' weights depend on the routing)
    dependent_start(lines)        the same around an L2 prefetch of `lines`, the program's first weight step (the
                                  decode linears: the weights are the model's, no kernel writes them), e.g.
                                  weight_lines' for an [N, K] weight
    released_after_wait()         wait first, then let the next kernel launch (the MoE gate/up kernel: the down
                                  kernel after it reads the routing before its own wait)
"""

import triton
import triton.language as tl


@triton.jit
def prefetch_l2(ptrs):
    """prefetch.global.L2 of every address in ptrs (a hint: no value, no fault), e.g. one per 128-byte line."""
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];", "=r,l", [ptrs], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def prefetch_l2_kept(ptrs):
    """prefetch.global.L2::evict_last of every address in ptrs: fetched to be read after another kernel's stream has
    passed through the L2 (whose loads should then be evict_first)."""
    tl.inline_asm_elementwise("prefetch.global.L2::evict_last [$1];", "=r,l", [ptrs], dtype=tl.int32, is_pure=False,
                              pack=1)


@triton.jit
def dependent_start(lines=None):
    """Let the next kernel launch once every program of this one has started (it runs up to its own wait while
    this one works), prefetch `lines` into L2 if given, then wait until the kernels before have completed and
    their writes are visible."""
    tl.extra.cuda.gdc_launch_dependents()
    if lines is not None:
        prefetch_l2(lines)
    tl.extra.cuda.gdc_wait()


@triton.jit
def released_after_wait():
    """Wait until the kernels before have completed and their writes are visible, then let the next kernel launch:
    its programs start only once this kernel's inputs are complete, so it may read them before its own wait (the
    MoE down projection reads the routing, two kernels back, to fetch its experts' weights early)."""
    tl.extra.cuda.gdc_wait()
    tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def weight_lines(w_ptr, offs_n, N, k_lo, stride_wn, BLOCK_K: tl.constexpr):
    """One address per 128-byte line of an [N, K] weight's rows offs_n, columns k_lo + [0, BLOCK_K) (at least the
    line at k_lo): [BLOCK_N, lines]. Rows past N read row N - 1 again, never out of bounds."""
    LINE: tl.constexpr = 1024 // w_ptr.dtype.element_ty.primitive_bitwidth  # elements in 128 bytes
    LINES: tl.constexpr = BLOCK_K // LINE if BLOCK_K >= LINE else 1
    rows = tl.minimum(offs_n, N - 1).to(tl.int64)
    return w_ptr + rows[:, None] * stride_wn + (k_lo + LINE * tl.arange(0, LINES))[None, :]
