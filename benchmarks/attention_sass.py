"""Instructions in the inner (KV-tile) loop of each attention kernel variant, from an offline sm_90 build.

    python benchmarks/attention_sass.py        # no GPU needed: Triton's front end, ptxas and cuobjdump

Builds every variant tests/kernels/sm90_compile.py builds for the paged decode, prefill and verify kernels and the
MLA decode and prefill kernels, disassembles the cubin, and counts the SASS instructions of its longest loop
(from a backward branch's target to the branch): what one KV tile of a program costs to issue. It compared the
kernels with block_size as a runtime argument and as a constexpr (2026-12-01, benchmarks/RESULTS.md).
"""

import os
import re
import subprocess
import sys
import tempfile

import triton

sys.path.insert(0, os.getcwd())
from tests.kernels import sm90_compile  # noqa: E402
from graphllm.kernels import paged_decode_attention as decode  # noqa: E402

CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
ADDRESS = re.compile(r"\s+/\*([0-9a-f]{4,6})\*/")
FLAGS = ("DIRECT", "MIXED", "ONE_TOKEN_ROWS", "KV_FP8", "SOFTCAP")


def sass(cubin: bytes) -> list[str]:
    """The instruction lines of a cubin's SASS."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([CUOBJDUMP, "-sass", f.name], capture_output=True, text=True, check=True).stdout
    return [line for line in text.splitlines() if ADDRESS.match(line)]


def longest_loop(lines: list[str]) -> int:
    """Instructions from a backward branch's target to the branch, the longest such span."""
    addresses = [int(ADDRESS.match(line).group(1), 16) for line in lines]
    best = 0
    for line, at in zip(lines, addresses):
        branch = re.search(r"BRA\s+(?:`\S+\s+)?0x([0-9a-f]+)\s*;", line)
        if branch and int(branch.group(1), 16) < at:
            target = int(branch.group(1), 16)
            best = max(best, sum(1 for a in addresses if target <= a <= at))
    return best


def main() -> int:
    for kernel, types, constexprs, options in (*sm90_compile.variants(), *sm90_compile.mla_variants()):
        if kernel is decode._decode_reduce_kernel or "rope" in kernel.__name__:
            continue  # no KV loop
        lines = sass(sm90_compile.compile_sm90(kernel, types, constexprs, options)["cubin"])
        flags = {k: v for k, v in constexprs.items() if k in FLAGS}
        print(f"{kernel.__name__} {flags}: loop {longest_loop(lines)} of {len(lines)} instructions", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
