"""`graphllm inspect ART`: what the compiler did to a model.

- the passes: nodes before/after and what each rewrote (from the manifest);
- the kernels Inductor generated: name, the graph nodes and ATen ops fused into each, and the
  model source lines those nodes came from (joining the wrapper's "Source Nodes" comments
  with graphs/nodes.json, saved at compile time);
- a kernel's source (`--kernel NAME`);
- a dump directory (`--dump DIR`): graph code before/after the passes, depyf's decompiled
  bytecode of the model functions that were captured, and Inductor's generated sources.
"""

import json
import re
import zipfile
from pathlib import Path

from graphllm.compiler import artifact as A
from graphllm.compiler.lower import kernel_table

SOURCE_SUFFIXES = (".cpp", ".py", ".json", ".ptx", ".ll")


def package_sources(art: Path) -> dict[str, str]:
    """Text sources inside the step package (wrapper, kernels), by file name."""
    with zipfile.ZipFile(art / A.STEP_PACKAGE) as z:
        return {Path(n).name: z.read(n).decode(errors="replace") for n in z.namelist()
                if n.endswith(SOURCE_SUFFIXES) and "/aotinductor/" in n}


def wrapper_source(sources: dict[str, str]) -> str:
    return next((text for name, text in sources.items() if name.endswith(".wrapper.cpp")), "")


def format_passes(manifest: dict) -> str:
    rows = [f"{'pass':<18} {'nodes before':>12} {'nodes after':>12} {'ms':>8}  rewrites"]
    for p in manifest["passes"]:
        counts = ", ".join(f"{k}={v}" for k, v in p["counts"].items() if v) or "-"
        if p.get("skipped"):
            counts = f"skipped: {p['skipped']}"
        rows.append(f"{p['name']:<18} {p['nodes_before']:>12} {p['nodes_after']:>12} "
                    f"{1000 * p['seconds']:>8.1f}  {counts}")
    return "\n".join(rows)


def format_quantization(manifest: dict) -> str:
    """The scheme, where it came from, and each quantized linear shape's kernel per decode bucket ('' if none)."""
    q = manifest.get("quantization")
    if not q:
        return ""
    head = (f"quantization: {q['scheme']} ({q['source']}"
            + (f", group {q['group_size']}" if q.get("group_size") else "") + f"), {q.get('quantized', 0)} linears")
    rows = [f"  {shape:<22} " + "; ".join(f"{b}: {route}" for b, route in routes.items())
            for shape, routes in q.get("kernels", {}).items()]
    return "\n".join([head, *rows])


def kernels_with_sources(art: Path) -> list[dict]:
    """Each kernel call with its fused nodes, ATen ops, module paths and source lines."""
    nodes = json.loads((art / "graphs" / "nodes.json").read_text())
    kernels = kernel_table(wrapper_source(package_sources(art)))
    for k in kernels:
        known = [nodes[n] for n in k["nodes"] if n in nodes]
        k["modules"] = sorted({n["module"] for n in known if n["module"]})
        k["sources"] = sorted({n["code"] for n in known if n["code"]})
    return kernels


def format_kernels(kernels: list[dict]) -> str:
    generated = {c for k in kernels for c in k["calls"] if c.startswith(("cpp_", "triton_"))}
    lines = [f"{len(kernels)} buffer groups, {len(generated)} distinct generated kernels"]
    for k in kernels:
        lines.append(" + ".join(k["calls"]))
        if k["aten"]:
            lines.append(f"    ops:     {', '.join(k['aten'])}")
        if k["modules"]:
            lines.append(f"    modules: {', '.join(k['modules'][:4])}" + (" ..." if len(k["modules"]) > 4 else ""))
        for src in k["sources"][:4]:
            lines.append(f"    source:  {src}")
    return "\n".join(lines)


def kernel_source(art: Path, name: str) -> str:
    """The definition of kernel `name` in the package's generated sources."""
    pattern = re.compile(rf"^(extern \"C\".*\b{re.escape(name)}\(|def {re.escape(name)}\()", re.M)
    for text in package_sources(art).values():
        for match in pattern.finditer(text):
            head = re.match(r"[^;{]*", text[match.end():]).end() + match.end()
            if text.startswith("def", match.start()) or text[head:head + 1] == "{":  # not a declaration
                return _definition_from(text, match.start())
    raise KeyError(f"no kernel named {name!r} in {art / A.STEP_PACKAGE}; `graphllm inspect {art}` lists them")


def _definition_from(text: str, start: int) -> str:
    """From `start` to the end of the C++ function (brace depth back to 0) or the Python def."""
    if text.startswith("def", start):
        end = re.search(r"^\S", text[start + 1:], re.M)
        return text[start:start + 1 + end.start()] if end else text[start:]
    depth, opened = 0, False
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        opened |= text[i] == "{"
        if opened and depth == 0:
            return text[start:i + 1]
    return text[start:]


def dump(art: Path, out: Path, manifest: dict) -> list[Path]:
    """Write graph code, depyf decompilations and generated sources under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name in ("before.py", "after.py", "before.txt", "after.txt"):
        if (art / "graphs" / name).is_file():
            written.append(_write(out / f"graph_{name}", (art / "graphs" / name).read_text()))
    for qualname, text in decompiled_model_functions(manifest).items():
        written.append(_write(out / "decompiled" / f"{qualname}.py", text))
    for name, text in package_sources(art).items():
        written.append(_write(out / "inductor" / name, text))
    return written


def decompiled_model_functions(manifest: dict) -> dict[str, str]:
    """depyf's decompilation of the bytecode of every forward that capture traced through."""
    import depyf
    from torch import nn
    from graphllm.ir.capture import StepModule
    from graphllm.models.registry import ARCHITECTURES
    module_cls, _ = ARCHITECTURES[manifest["model"]["architecture"]]
    module = __import__(module_cls.__module__, fromlist=["_"])
    classes = [StepModule] + [c for c in vars(module).values()
                              if isinstance(c, type) and issubclass(c, nn.Module) and c.__module__ == module.__name__]
    return {f"{c.__name__}.forward": depyf.decompile(c.forward) for c in classes if "forward" in vars(c)}


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path
