"""Lowering: a post-pass StepGraph -> an AOTInductor package, and loading it back.

Inductor generates C++ (CPU) or Triton (GPU) kernels for the whole step; the attention op
stays an extern call. The package keeps the weights out of the shared library
(`package_constants_in_so=False`): the artifact stores them once as safetensors, and loading
hands them to the compiled model as user-managed constants, with no copy and no code generation.
"""

import json
import re
from pathlib import Path

import torch

from graphllm.ir.graph import StepGraph, module_path

INDUCTOR_CONFIGS = {"aot_inductor.package_constants_in_so": False}
SOURCE_NODES = re.compile(r"//\s*Topologically Sorted Source Nodes: \[(.*?)\], Original ATen: \[(.*?)\]")


def lower(graph: StepGraph, package: Path) -> torch.export.ExportedProgram:
    """Compile graph into the AOTInductor package at `package`; returns the exported program lowered."""
    from graphllm.compiler.decompositions import inductor_decompositions
    exported = graph.export()
    with inductor_decompositions():
        torch._inductor.aoti_compile_and_package(exported, package_path=str(package),
                                                 inductor_configs=INDUCTOR_CONFIGS)
    return exported


def open_package(package: Path, device: torch.device):
    """The AOTInductor model in `package`, built straight from its loader.

    aoti_load_package would first compile Inductor's CPU-ISA probe programs with g++ just to
    log a warning on mismatch; our environment fingerprint checks the CPU flags instead, so
    loading compiles nothing. run_single_threaded lets a CUDA graph capture the call.
    """
    from torch.export.pt2_archive._package import AOTICompiledModel
    device_index = -1 if device.type == "cpu" else (device.index or 0)
    loader = torch._C._aoti.AOTIModelPackageLoader(str(package), "model", device.type == "cuda", 1, device_index)
    return AOTICompiledModel(loader)


def load_package(package: Path, weights: dict[str, torch.Tensor], device: torch.device):
    """The compiled step, with the artifact's weights bound as user-managed constants."""
    runner = open_package(package, device)
    fqns = runner.get_constant_fqns()
    missing = [name for name in fqns if name not in weights]
    if missing:
        raise ValueError(f"compiled step needs weights the artifact lacks: {missing[:5]}")
    runner.load_constants({name: weights[name] for name in fqns}, check_full_update=True, user_managed=True)
    return runner


def node_table(exported: torch.export.ExportedProgram) -> dict[str, dict[str, str]]:
    """Lowered node name -> its module path, op and source line (for `graphllm inspect`)."""
    table = {}
    for node in exported.graph.nodes:
        if node.op != "call_function":
            continue
        trace = (node.meta.get("stack_trace") or "").strip().splitlines()
        source = next((line.strip() for line in reversed(trace) if line.strip().startswith("File")), "")
        code = trace[-1].strip() if trace else ""
        table[node.name] = {"module": module_path(node), "op": str(node.target), "source": source, "code": code}
    return table


def kernel_table(wrapper_source: str) -> list[dict]:
    """Kernel calls of an AOTInductor wrapper, each with the graph nodes and ATen ops fused into it."""
    kernels, lines = [], wrapper_source.splitlines()
    for i, line in enumerate(lines):
        match = SOURCE_NODES.search(line)
        if not match:
            continue
        call = next((l.strip() for l in lines[i + 1:i + 6] if "(" in l and not l.strip().startswith("//")), "")
        name = re.split(r"[(<\s]", call.split("=")[-1].strip())[0] if call else ""
        kernels.append({"kernel": name, "nodes": [n.strip() for n in match.group(1).split(",") if n.strip()],
                        "aten": [a.strip() for a in match.group(2).split(",") if a.strip()]})
    return kernels


def save_node_table(exported: torch.export.ExportedProgram, path: Path) -> None:
    path.write_text(json.dumps(node_table(exported), indent=1))

