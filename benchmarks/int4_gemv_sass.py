"""Offline sm_90 SASS of the int4 GEMV's K loop on each of its paths (no GPU needed): instructions in the
loop's body (from its backward branch's target to the branch), its global loads, and the most frequent opcodes, per
variant. Built with the divisibility hints Triton's launcher gives at the 8B shapes (sm90_compile.runtime_hints:
pointers 16-byte aligned, N, K, K_SPLIT and G multiples of 16), so that the loads vectorize and the layouts are the
GPU's; --no-hints builds what any shape could run (s40's counts were taken so: every load scalar, the x side of
the F16 path repeated for 4 word-row pairs a thread instead of 1). Needs Triton 3.6 (the GPU image's), e.g.

    pip install --no-deps --target /tmp/t36 triton==3.6.0
    PYTHONPATH=/tmp/t36:. python benchmarks/int4_gemv_sass.py [--no-hints] [--opcodes] [--dot]

--dot: the K loops of the 16-row dot-tile kernel (_int4_matmul_kernel) at CONFIGS' 2-16-row tiles instead.
--folds: each 8B one-row shape at its CONFIGS path, plain and with the folds s43 built (gate_up's SwiGLU finish,
EPILOGUE; o_proj's and down's add + norm finish, NORM; qkv's and gate_up's 1 / rms, RSTD_GROUPS): the K loop and the
whole kernel's instructions (the folds belong outside the loop).
"""

import collections
import re
import sys

from benchmarks.attention_sass import ADDRESS, sass
from graphllm.kernels import int4_matmul
from tests.kernels import sm90_compile
from tests.kernels.sm90_compile import compile_sm90

TYPES = dict(x_ptr="*bf16", qw_ptr="*i32", scales_ptr="*bf16", zeros_ptr="*bf16", bias_ptr="*bf16", out_ptr="*bf16",
             partial_ptr="*fp32", count_ptr="*i32")
# (F16, PARTS, BLOCK_N, PREFETCH, num_stages): the float32 GEMV with and without its register prefetch, with its
# words as cp.async 2 steps ahead, and the F16 one in 4 parts, plain and with cp.async
PATHS = ((0, 2, 128, True, 1), (0, 2, 128, False, 1), (0, 2, 128, False, 2), (1, 4, 256, False, 1),
         (1, 4, 256, False, 2))
OPCODE = re.compile(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+(?:\.[A-Z0-9]+)?)")


def loop_bodies(lines: list[str], at_least: int = 50) -> list[list[str]]:
    """The instruction lines from each backward branch's target to the branch (a loop of at_least or more)."""
    addresses = [int(ADDRESS.match(line).group(1), 16) for line in lines]
    bodies = []
    for line, at in zip(lines, addresses):
        branch = re.search(r"BRA\s+(?:`\S+\s+)?0x([0-9a-f]+)\s*;", line)
        if branch and int(branch.group(1), 16) < at:
            body = [ln for ln, a in zip(lines, addresses) if int(branch.group(1), 16) <= a <= at]
            if len(body) >= at_least:
                bodies.append(body)
    return bodies


def opcodes(body: list[str]) -> collections.Counter:
    return collections.Counter(m.group(1) for m in map(OPCODE.search, body) if m)


def weights_per_thread(block_n: int, block_k: int = 128, warps: int = 4) -> int:
    return block_n * block_k // (32 * warps)


def print_loops(asm: dict, label: str, per: int | None, show: bool) -> None:
    for body in loop_bodies(sass(asm["cubin"]), 30 if per is None else 50):
        count = opcodes(body)
        loads = sum(n for op, n in count.items() if op.startswith("LDG"))
        rate = "" if per is None else f" ({len(body) / per:.2f} a weight)"
        print(f"{label} {len(body)} instructions{rate}, {loads} LDG", flush=True)
        if show:
            print("    " + ", ".join(f"{op} {n}" for op, n in count.most_common(16)))


def dot_tiles(hints: bool, show: bool) -> None:
    """The K loop of _int4_matmul_kernel's 16-row dot tiles at CONFIGS' tiles (sm90_compile.int4_variants)."""
    for kernel, types, constexprs, options in sm90_compile.int4_variants():
        asm = compile_sm90(kernel, types, constexprs, {"num_warps": 4, **options}, hints)
        print_loops(asm, "16 rows {BLOCK_N} x {BLOCK_K} PAIRS {PAIRS} SWAP_AB {SWAP_AB}:".format(**constexprs), None,
                    show)


# shape -> (CONFIGS' one-row config, the folds row_sumsq / linear_epilogue give it)
FOLDS = {"qkv 6144 x 4096": ((1, 6144, 4096), {"RSTD_GROUPS": 256}),
         "o_proj 4096 x 4096": ((1, 4096, 4096), {"NORM": 1}),
         "gate_up 28672 x 4096": ((1, 28672, 4096), {"EPILOGUE": 1, "RSTD_GROUPS": 256}),
         "down 4096 x 14336": ((1, 4096, 14336), {"NORM": 1})}
FOLD_TYPES = dict(TYPES, res_ptr="*bf16", norm_w_ptr="*bf16", h_ptr="*bf16", sumsq_ptr="*fp32", eps="fp32")


def folds(hints: bool) -> None:
    """The K loop and the whole kernel, plain and folded, at each shape's CONFIGS path."""
    for shape, (key, fold) in FOLDS.items():
        config = int4_matmul.CONFIGS[key]
        base = dict(HAS_BIAS=False, BLOCK_N=config["BLOCK_N"], BLOCK_K=128, SPLIT_K=config["SPLIT_K"], EVEN_N=True,
                    NUM_STAGES=config["num_stages"], PREFETCH=config.get("PREFETCH", False), PDL=True,
                    F16=1 if config.get("F16") else 0, PARTS=int4_matmul.gemv_parts(config), GROUP_SHIFT=7)
        options = {"num_stages": config["num_stages"], "num_warps": config["num_warps"], "launch_pdl": True}
        for label, constexprs in (("plain", base), ("folded " + " ".join(fold), dict(base, **fold))):
            lines = sass(compile_sm90(int4_matmul._int4_gemv_kernel, FOLD_TYPES, constexprs, options, hints)["cubin"])
            loops = [len(b) for b in loop_bodies(lines)]
            print(f"{shape:<21} {label:<28} K loop {loops} instructions, kernel {len(lines)}", flush=True)


def main() -> None:
    hints, show = "--no-hints" not in sys.argv, "--opcodes" in sys.argv
    if "--dot" in sys.argv:
        dot_tiles(hints, show)
        return
    if "--folds" in sys.argv:
        folds(hints)
        return
    for f16, parts, block_n, prefetch, stages in PATHS:
        constexprs = dict(HAS_BIAS=False, BLOCK_N=block_n, BLOCK_K=128, SPLIT_K=8, EVEN_N=True, NUM_STAGES=stages,
                          PREFETCH=prefetch, PDL=True, F16=f16, PARTS=parts, GROUP_SHIFT=7)
        asm = compile_sm90(int4_matmul._int4_gemv_kernel, TYPES, constexprs,
                           {"num_stages": stages, "num_warps": 4, "launch_pdl": True}, hints)
        path = ("F16 x4" if f16 else "float32") + (" PREFETCH" if prefetch else "") + (
            f" {stages} stages" if stages > 1 else "")
        print_loops(asm, f"{path:<19}", weights_per_thread(block_n), show)


if __name__ == "__main__":
    main()
