"""Offline sm_90 SASS of the int4 GEMV's K loop, with and without a prologue (no GPU needed): instructions and
global loads between the loop's label and its backward branch, per variant. Needs Triton 3.6 (the GPU image's) and
its nvdisasm, e.g.

    pip install --no-deps --target /tmp/t36 triton==3.6.0
    PYTHONPATH=/tmp/t36:. python benchmarks/int4_gemv_sass.py
"""

import os
import re
import subprocess
import tempfile

import triton

from graphllm.kernels import int4_matmul, skinny_matmul
from tests.kernels.sm90_compile import compile_sm90

NVDISASM = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
TYPES = dict(x_ptr="*bf16", qw_ptr="*i32", scales_ptr="*bf16", zeros_ptr="*bf16", bias_ptr="*bf16", out_ptr="*bf16",
             partial_ptr="*fp32", count_ptr="*i32", res_ptr="*bf16", norm_w_ptr="*bf16", new_res_ptr="*bf16",
             eps="fp32")


def loops(cubin: bytes) -> list[tuple[int, int]]:
    """(instructions, LDG) of each backward-branch loop body in the cubin's SASS."""
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        sass = subprocess.run([NVDISASM, "-c", f.name], capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(f.name)
    labels, instructions, found = {}, [], []
    for line in sass.splitlines():
        label = re.match(r"^\.(L_x_\d+):", line.strip())
        if label:
            labels[label.group(1)] = len(instructions)
        elif re.search(r"/\*[0-9a-f]{4,}\*/", line):
            instructions.append(line)
    for i, line in enumerate(instructions):
        target = re.search(r"BRA\s+(?:`\()?\.?(L_x_\d+)", line)
        if target and labels.get(target.group(1), i + 1) <= i:
            body = instructions[labels[target.group(1)]:i + 1]
            found.append((len(body), sum("LDG" in b for b in body)))
    return found


def main() -> None:
    for prologue in ("none", "add_rms_norm", "silu_mul"):
        for f16, parts, block_n, prefetch in ((0, 2, 128, True), (0, 2, 128, False), (1, 4, 256, False)):
            constexprs = dict(HAS_BIAS=False, BLOCK_N=block_n, BLOCK_K=128, SPLIT_K=8, EVEN_N=True, NUM_STAGES=1,
                              PREFETCH=prefetch, PDL=True, F16=f16, PARTS=parts,
                              PROLOGUE=skinny_matmul.PROLOGUES[prologue], NORM_BLOCK=1024)
            asm = compile_sm90(int4_matmul._int4_gemv_kernel, TYPES, constexprs,
                               {"num_stages": 1, "num_warps": 4, "launch_pdl": True})
            path = ("F16 x4" if f16 else "float32") + (" PREFETCH" if prefetch else "")
            print(f"{prologue:<13} {path:<17} loops (instructions, LDG): {loops(asm['cubin'])}")


if __name__ == "__main__":
    main()
