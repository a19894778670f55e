"""The house is one-way: graphllm's modules import no cycle, and no room imports a room above it.

Read from the source with ast (nothing is executed), every import counted, also those inside
functions: a lazy import is still a dependency. Rooms, ground up (docs/ARCHITECTURE.md):

  base      version, config, speculative_config, device, demo: leaves that import nothing of graphllm but each other
  kernels   Triton kernels and their pure-torch references: import nothing of graphllm but kernels/
  backends  attention backends (torch, triton, flashinfer) and the scope that activates one
  ops       custom-op registration
  models    plain PyTorch models, loader, registry
  ir        capture of the step as an fx graph with its weights
  passes    fusion / lowering / utility passes and their manager
  compiler  pipeline, lowering, artifact, cache
  runtime   engine, scheduler, KV cache, runner, sampler
  server    the OpenAI-compatible HTTP server
  cli       the command line and the benchmarks it runs (graphllm/cli, graphllm/bench)
  api       the root package `graphllm`, which exports the public API (lazily)
"""

import ast
import gc
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "graphllm"
LAYERS = [  # (room, module prefixes), ground up
    ("base", ("graphllm.version", "graphllm.config", "graphllm.speculative_config", "graphllm.device", "graphllm.demo")),
    ("kernels", ("graphllm.kernels",)),
    ("backends", ("graphllm.backends",)),
    ("ops", ("graphllm.ops",)),
    ("models", ("graphllm.models",)),
    ("ir", ("graphllm.ir",)),
    ("passes", ("graphllm.passes",)),
    ("compiler", ("graphllm.compiler",)),
    ("runtime", ("graphllm.runtime",)),
    ("server", ("graphllm.server",)),
    ("cli", ("graphllm.cli", "graphllm.bench")),
    ("api", ("graphllm",)),
]
# what a room may import besides itself and the rooms below it; kernels are leaves
ONLY = {"kernels": ("kernels",)}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """graphllm modules `path` imports (absolute names; `from a import b` counts a.b when b is a module)."""
    name, found = module_name(path), set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    modules = all_modules()
    return {m for m in found if m in modules and m != name}


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def room_of(module: str) -> int:
    """Index into LAYERS of the room holding module (longest matching prefix)."""
    best = max((len(prefix), i) for i, (_, prefixes) in enumerate(LAYERS) for prefix in prefixes
               if module == prefix or module.startswith(prefix + "."))
    return best[1]


def import_graph() -> dict[str, set[str]]:
    # The garbage collector stays off while ast builds trees: a finalizer that the collector runs in the
    # middle (engines of earlier tests) moves CPython 3.11's recursion counter under the AST constructor,
    # which then raises "SystemError: AST constructor recursion depth mismatch" (seen once in CI form).
    gc.collect()
    gc.disable()
    try:
        return {name: imports_of(path) for name, path in all_modules().items()}
    finally:
        gc.enable()


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path [a, b, ..., a], or None (iterative depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for root in sorted(graph):
        if root in state:
            continue
        path, stack = [root], [iter(sorted(graph[root]))]
        state[root] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return None


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for module, deps in graph.items():
        room = room_of(module)
        allowed = ONLY.get(LAYERS[room][0])
        for dep in deps:
            dep_room = room_of(dep)
            if dep_room > room or (allowed is not None and LAYERS[dep_room][0] not in allowed):
                bad.append(f"{module} ({LAYERS[room][0]}) imports {dep} ({LAYERS[dep_room][0]})")
    return sorted(bad)


def test_every_module_has_a_room():
    """A new top-level module must be given a room: else it falls into the root's, which may import anything."""
    assert [m for m in all_modules() if LAYERS[room_of(m)][0] == "api" and m != "graphllm"] == []


def test_no_import_cycles():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_room_imports_a_room_above_it():
    assert upward_imports(import_graph()) == []


def test_the_checks_catch_a_cycle_and_an_upward_import():
    """The checks themselves work: a made-up graph with both faults is caught."""
    graph = {"graphllm.kernels.a": {"graphllm.ops.attention"}, "graphllm.ops.attention": {"graphllm.kernels.a"},
             "graphllm.runtime.x": {"graphllm.server.app"}, "graphllm.server.app": set()}
    assert find_cycle(graph) in (["graphllm.kernels.a", "graphllm.ops.attention", "graphllm.kernels.a"],
                                 ["graphllm.ops.attention", "graphllm.kernels.a", "graphllm.ops.attention"])
    assert upward_imports(graph) == [
        "graphllm.kernels.a (kernels) imports graphllm.ops.attention (ops)",
        "graphllm.runtime.x (runtime) imports graphllm.server.app (server)"]


@pytest.mark.parametrize("room", ["kernels", "backends", "ops", "models"])
def test_low_rooms_import_without_the_runtime(room):
    """Importing a low room does not pull in the runtime (the root package's exports are lazy)."""
    import subprocess
    import sys
    code = (f"import importlib, pkgutil, sys, graphllm.{room} as r\n"
            "[importlib.import_module(m.name) for m in pkgutil.walk_packages(r.__path__, r.__name__ + '.')]\n"
            "print(sorted(m for m in sys.modules if m.startswith(('graphllm.runtime', 'graphllm.server'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
