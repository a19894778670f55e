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
    from graphllm.compiler.inductor_lowering import shallow_operator_str
    exported = graph.export()
    with inductor_decompositions(), shallow_operator_str():
        torch._inductor.aoti_compile_and_package(exported, package_path=str(package),
                                                 inductor_configs=INDUCTOR_CONFIGS)
    return exported


def open_package(package: Path, device: torch.device):
    """The AOTInductor model in `package`.

    On CPU it is built straight from its loader: aoti_load_package would first compile
    Inductor's CPU-ISA probe programs with g++ only to log a warning on mismatch, and our
    environment fingerprint checks the CPU flags instead, so loading compiles nothing. On CUDA
    (where that direct construction crashed on torch 2.11) the public loader is used, with
    run_single_threaded so that a CUDA graph can capture the call.
    """
    if device.type == "cuda":
        return torch._inductor.aoti_load_package(str(package), run_single_threaded=True)
    from torch.export.pt2_archive._package import AOTICompiledModel
    loader = torch._C._aoti.AOTIModelPackageLoader(str(package), "model", False, 1, -1)
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


KERNEL_CALL = re.compile(r"\b((?:cpp|triton)_\w+|aoti_torch_(?:cpu|cuda)_\w+|aoti_torch_proxy_executor_call_function)\(")


def kernel_table(wrapper_source: str) -> list[dict]:
    """The wrapper's kernel calls in order, grouped by Inductor's "Source Nodes" comments.

    Inductor writes such a comment right before the call it describes, naming the graph nodes
    and ATen ops of that call. On CPU only extern calls (aoti_torch_cpu_mm_out, custom ops
    through the proxy executor) get one, and their nodes include those of the unrealized inputs
    they consumed: the generated kernels (cpp_fused_*) called since the previous comment's call,
    which have no comment of their own. So a group is those uncommented calls plus the call
    after the comment: cpp_fused_silu_and_mul_3 goes with the down projection's comment, which
    names silu_and_mul, not with the gate/up projection's before it. Calls after the last
    commented call form a group with no nodes.
    """
    lines = wrapper_source.splitlines()
    body = next((i for i, line in enumerate(lines) if "::run_impl(" in line), 0)
    kernels, calls, comments = [], [], []
    for line in lines[body + 1:]:
        if match := SOURCE_NODES.search(line):
            comments.append(match)  # describes the next call
            continue
        new = [c for c in KERNEL_CALL.findall(line) if c not in calls]
        calls += new
        if new and comments:
            kernels.append(_kernel_group(calls, comments))
            calls, comments = [], []
    if calls:
        kernels.append(_kernel_group(calls, []))
    return kernels


def _kernel_group(calls: list[str], comments: list[re.Match]) -> dict:
    split = lambda text: [part.strip() for part in text.split(",") if part.strip()]  # noqa: E731
    nodes = [n for m in comments for n in split(m.group(1))]
    aten = [op for m in comments for op in split(m.group(2))]
    return {"calls": calls, "nodes": list(dict.fromkeys(nodes)), "aten": list(dict.fromkeys(aten))}


def save_node_table(exported: torch.export.ExportedProgram, path: Path) -> None:
    path.write_text(json.dumps(node_table(exported), indent=1))

