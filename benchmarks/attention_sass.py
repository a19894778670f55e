"""Instructions in the inner (KV-tile) loop of each attention kernel variant, from an offline sm_90 build.

    python benchmarks/attention_sass.py [--runtime-hints]   # no GPU needed: Triton's front end, ptxas and cuobjdump

With the GPU image's Triton on the path first (`pip install --no-deps --target DIR triton==3.6.0`, then
PYTHONPATH=DIR), the counts are the GPU's compiler's: they differ from newer Triton's (2026-12-02: the fp8
decode loop 436 instructions and 128 registers under 3.6, 393 and 112 under 3.9).

Builds every variant tests/kernels/sm90_compile.py builds for the paged decode, prefill and verify kernels and the
MLA decode and prefill kernels, disassembles the cubin, and counts the SASS instructions of each of its loops
(from a backward branch's target to the branch): what one KV tile of a program costs to issue (the prefill and
verify kernels run the tiles every row sees whole in a loop without masks). With --runtime-hints
the build gets the divisibility hints Triton's launcher gives at run time at the 8B shapes (every pointer 16-byte
aligned, every integer argument a multiple of 16 but those the kernel does not specialize), so that the loads
vectorize as they do on the GPU; without them every load is scalar. It compared the kernels with block_size as a
runtime argument and as a constexpr (2026-12-01, benchmarks/RESULTS.md).
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
FLAGS = ("DIRECT", "MIXED", "ONE_TOKEN_ROWS", "KV_FP8", "SOFTCAP", "WINDOWED", "ROPE", "HALVES")


def sass(cubin: bytes) -> list[str]:
    """The instruction lines of a cubin's SASS."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([CUOBJDUMP, "-sass", f.name], capture_output=True, text=True, check=True).stdout
    return [line for line in text.splitlines() if ADDRESS.match(line)]


def registers(cubin: bytes) -> str:
    """cuobjdump's resource usage of a cubin: registers a thread, stack (spills), shared memory."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([CUOBJDUMP, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    return " ".join(re.findall(r"REG:\d+|STACK:\d+", text))


def loops(lines: list[str], at_least: int = 50) -> list[int]:
    """Instructions from each backward branch's target to the branch, in code order, spans of at_least or more
    (a KV loop; rows_attention has one for the tiles it masks and one for those it need not)."""
    addresses = [int(ADDRESS.match(line).group(1), 16) for line in lines]
    spans = []
    for line, at in zip(lines, addresses):
        branch = re.search(r"BRA\s+(?:`\S+\s+)?0x([0-9a-f]+)\s*;", line)
        if branch and int(branch.group(1), 16) < at:
            target = int(branch.group(1), 16)
            spans.append(sum(1 for a in addresses if target <= a <= at))
    return [n for n in spans if n >= at_least]


def build(kernel, types: dict[str, str], constexprs: dict, options: dict, hints: bool) -> bytes:
    return sm90_compile.compile_sm90(kernel, types, constexprs, options, hints)["cubin"]


def main() -> int:
    hints = "--runtime-hints" in sys.argv
    for kernel, types, constexprs, options in (*sm90_compile.variants(), *sm90_compile.mla_variants()):
        if kernel is decode._decode_reduce_kernel or "rope" in kernel.__name__:
            continue  # no KV loop
        cubin = build(kernel, types, constexprs, options, hints)
        lines = sass(cubin)
        flags = {k: v for k, v in constexprs.items() if k in FLAGS}
        print(f"{kernel.__name__} {flags}: loops {loops(lines)} of {len(lines)} instructions, {registers(cubin)}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
