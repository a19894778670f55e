"""The "inductor" lowering, used on CUDA: Inductor's standalone compile of the exported graph.

Why not AOTInductor there: on the lent H200 (torch 2.11+cu130), loading any AOTInductor
package segfaulted, a one-layer model included (benchmarks/diag_aoti_cuda.py). This route
runs the same Inductor/Triton code generation on the post-pass graph, but with the weights
lifted to inputs (torch.export's graph signature) and packs the result as a
`CompiledArtifact` in binary form: the generated wrapper and the compiled Triton kernels.
Loading unpacks it with no Triton compilation and no Dynamo; symbolic sizes come from the
export (T, B, M, N, KV blocks), so one compiled graph serves every batch shape.

On CPU the binary form does not carry the built C++ kernels (they would be rebuilt at load),
so CPU artifacts use AOTInductor (lower.py).

Inductor runs with `emulate_precision_casts`: where eager PyTorch rounds an intermediate to
bf16/fp16 (the residual sum before RMSNorm, the rotary products, silu before the multiply),
the fused kernels round it too, so the compiled step computes the eager model's function in
half precision as well, not a more precise neighbour of it. That costs a few conversions in
memory-bound kernels.

Inductor formats every graphllm op it meets first as an implicit fallback into a log line, eagerly in torch 2.11
(`OperatorIssue.operator_str`; 2.13 defers it). An IR node's text holds its inputs' text, so where a layer's op
reads two outputs of the op before it (row_sumsq's residual and row statistics) the text doubles per layer: the
8B step's compile under row_sumsq never finished (2026-12-06, H100; its one unpaired down_proj, the first op of
its kind, is 31 layers deep).
lower_inductor (and lower.py's AOTInductor compile) format those arguments by name and shape only.
"""

import contextlib
import logging
from pathlib import Path

import torch

from graphllm.ir import StepGraph

STEP_INDUCTOR = "step.inductor"
logger = logging.getLogger(__name__)


def export_step(graph: StepGraph) -> torch.export.ExportedProgram:
    """The step exported with its weights lifted to inputs (what lower_inductor compiles; its constants are
    the weights the artifact stores, so they can be written while Inductor runs)."""
    exported = graph.export()
    for node in exported.graph_module.graph.nodes:  # "from_graph" finds export's fake mode (its symbols and
        if "val" in node.meta:  # ranges) here; without it, it re-symbolises every dim and unifies equal sizes
            node.meta.setdefault("example_value", node.meta["val"])
    return exported


def inductor_options(pdl: bool) -> dict:
    """Inductor's config for the step: eager's rounding, and with pdl its Triton kernels made for programmatic
    dependent launch (triton.enable_pdl) where this torch has that option (else a log line says so)."""
    options = {"emulate_precision_casts": True}
    if pdl and hasattr(torch._inductor.config.triton, "enable_pdl"):
        options["triton.enable_pdl"] = True
    elif pdl:
        logger.warning("inductor_pdl: torch %s's Inductor has no triton.enable_pdl; its kernels launch plainly",
                       torch.__version__)
    return options


def lower_inductor(exported: torch.export.ExportedProgram, path: Path, pdl: bool = False,
                   persistent_norms: bool = False) -> list[str]:
    """Compile export_step's program and save it; returns the weight names the step takes first. pdl:
    inductor_options'; persistent_norms: persistent_rows (CompileConfig.persistent_norms)."""
    from graphllm.compiler.decompositions import inductor_decompositions
    gm = exported.graph_module  # weights lifted: placeholders for parameters, buffers, then user inputs
    fake_inputs = [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]
    rows = persistent_rows() if persistent_norms else contextlib.nullcontext()
    with inductor_decompositions(), torch._inductor.config.patch(inductor_options(pdl)), shallow_operator_str(), rows:
        compiled = torch._inductor.standalone_compile(gm, fake_inputs, dynamic_shapes="from_graph")
    compiled.save(path=str(path), format="binary")
    return lifted_weight_names(exported)


PERSISTENT_ROW_NUMEL = 8192  # persistent_rows: rows up to this many elements (Inductor's own limit is 1,024)


def persistent_choices():
    """Inductor's InductorChoices with should_use_persistent_reduction also true for an inner (row) reduction of
    up to PERSISTENT_ROW_NUMEL elements: the norm's row is then loaded once into registers (XBLOCK 1), where
    Inductor's looped reduction reads it once a loop (the sum of squares, max|x| for a quantization, the
    output). Every other reduction is decided by Inductor's heuristic as before."""
    from torch._inductor.choices import InductorChoices
    from torch._inductor.runtime.hints import ReductionHint
    from torch._inductor.virtualized import V

    class PersistentRows(InductorChoices):
        @staticmethod
        def should_use_persistent_reduction(features, cooperative_reduction: bool) -> bool:
            if InductorChoices.should_use_persistent_reduction(features, cooperative_reduction):
                return True
            return (not cooperative_reduction and features.get_reduction_hint() == ReductionHint.INNER
                    and V.graph.sizevars.statically_known_leq(features.reduction_numel, PERSISTENT_ROW_NUMEL))

    return PersistentRows()


@contextlib.contextmanager
def persistent_rows():
    """While Inductor lowers: persistent_choices() as its choices handler, and its name in Inductor's cache keys
    (torch.compiler.config.cache_key_tag, where this torch has it: the handler is not in them otherwise, and a
    graph compiled without it would be found in the FX graph cache)."""
    from torch._inductor.virtualized import V
    compiler_config = torch.compiler.config
    tagged = contextlib.nullcontext()
    if hasattr(compiler_config, "cache_key_tag"):
        tag = ":".join(t for t in (compiler_config.cache_key_tag, f"persistent-rows-{PERSISTENT_ROW_NUMEL}") if t)
        tagged = compiler_config.patch(cache_key_tag=tag)
    with tagged, V.set_choices_handler(persistent_choices()):
        yield


def _shallow(arg) -> str:
    """An argument of an op as Inductor's messages show it, without its inputs: an IR node by buffer name and
    size, a list item by item, anything else as itself."""
    if isinstance(arg, (list, tuple)):
        return "[" + ", ".join(_shallow(a) for a in arg) + "]"
    from torch._inductor import ir
    if isinstance(arg, ir.IRNode):
        try:
            name = arg.get_name()
        except Exception:  # an unrealised node (a view, a pointwise body) has no buffer name
            name = "?"
        try:
            size = list(arg.get_size())
        except Exception:
            size = "?"
        return f"{type(arg).__name__}(name={name}, size={size})"
    return str(arg)


@contextlib.contextmanager
def shallow_operator_str():
    """Inductor's operator messages (implicit fallbacks, lowering errors) with each argument shown by _shallow."""
    from torch._inductor import exc

    def operator_str(target, args, kwargs) -> str:
        lines = [f"target: {target}"] + [f"args[{i}]: {_shallow(a)}" for i, a in enumerate(args)]
        if kwargs:
            lines.append("kwargs: {" + ", ".join(f"{k}: {_shallow(v)}" for k, v in kwargs.items()) + "}")
        return "\n".join("  " + line for line in lines)

    original = exc.OperatorIssue.__dict__["operator_str"]
    exc.OperatorIssue.operator_str = staticmethod(operator_str)
    try:
        yield
    finally:
        exc.OperatorIssue.operator_str = original


def lifted_weight_names(exported: torch.export.ExportedProgram) -> list[str]:
    """Names of the parameters, buffers and constants the lifted graph takes before the user inputs."""
    kinds = ("PARAMETER", "BUFFER", "CONSTANT_TENSOR")
    return [spec.target for spec in exported.graph_signature.input_specs if spec.kind.name in kinds]


def load_inductor_artifact(path: Path):
    """The saved compiled step (no weights needed: bind_inductor_step binds them)."""
    return torch._inductor.CompiledArtifact.load(path=str(path), format="binary")


def bind_inductor_step(compiled, weight_names: list[str], weights: dict[str, torch.Tensor]):
    """The compiled step as a callable over the flat step inputs (kv_caches as a list)."""
    lifted = [weights[name] for name in weight_names]

    def step(input_ids, positions, slot_mapping, block_tables, seq_lens, query_start_loc, logits_indices,
             kv_caches):
        out = compiled(*lifted, input_ids, positions, slot_mapping, block_tables, seq_lens, query_start_loc,
                       logits_indices, *kv_caches)
        return out[0]

    return step
