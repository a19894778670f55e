"""Write a quant_kernel_sweep.py result's best configs into a kernel module's CONFIGS, in place.

    python benchmarks/apply_sweep_configs.py SWEEP.json KERNEL    (KERNEL: int4, int8 or fp8; fp8q writes fp8)

Entries the sweep measured replace the module's (m_bucket, N, K) keys; the others stay. Used inside one
device call (gpu_run.sh's qsweep-int4-apply) so that a sweep and the end-to-end bench that uses its configs
run on the same machine; on the workstation, paste the printed block by hand and review it.
"""

import importlib
import json
import re
import sys
from pathlib import Path

from graphllm.kernels.int8_matmul import m_bucket

HEADER = re.compile(r"^CONFIGS: dict\[tuple\[int, int, int\], dict\] = \{\n(.*?)^\}\n", re.S | re.M)


def merged_configs(report: dict, kernel: str, current: dict) -> dict:
    """current updated with the sweep's best config of every (m_bucket, N, K) it measured for kernel."""
    merged = dict(current)
    for row in report["rows"]:
        if row["kernel"] == kernel and row.get("best_config"):
            merged[(m_bucket(row["m"]), row["n"], row["k"])] = row["best_config"]
    return merged


def rewrite(source: str, configs: dict) -> str:
    """source with its CONFIGS literal replaced by configs (one entry per line, keys sorted by N, K, M); an
    entry left as it was keeps its line, trailing comment included."""
    block = HEADER.search(source)
    if not block:
        raise ValueError("no `CONFIGS: dict[tuple[int, int, int], dict] = {` block to rewrite")
    old_lines = {line.split(": {")[0].strip(): line for line in block.group(1).splitlines()}
    lines = ""
    for key, value in sorted(configs.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0])):
        line = f"    {key!r}: {value!r},"
        kept = old_lines.get(repr(key), "")
        lines += (kept if kept.split("  #")[0].rstrip() == line else line) + "\n"
    return HEADER.sub(lambda _: "CONFIGS: dict[tuple[int, int, int], dict] = {\n" + lines + "}\n", source, count=1)


def main(argv: list[str]) -> None:
    report = json.loads(Path(argv[0]).read_text())
    kernel = argv[1]
    module = importlib.import_module(f"graphllm.kernels.{'fp8' if kernel == 'fp8q' else kernel}_matmul")
    path = Path(module.__file__)
    configs = merged_configs(report, kernel, module.CONFIGS)
    path.write_text(rewrite(path.read_text(), configs))
    print(f"{path}: {len(configs)} CONFIGS entries ({len(configs) - len(module.CONFIGS)} new)")


if __name__ == "__main__":
    main(sys.argv[1:])
