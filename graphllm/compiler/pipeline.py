"""`graphllm compile`: HF folder -> artifact, in timed phases with a progress bar (on stderr, as is
the timing summary: `graphllm generate` compiling on the fly prints only the answer on stdout).

    load -> capture -> passes -> lower -> write

The artifact's cache key hashes everything the result depends on: graphllm's version, the
compile config, the pass list with each pass's uuid, the model config, the weight
fingerprints and the environment fingerprint.
"""

import dataclasses
import functools
import hashlib
import json
import logging
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import torch
from tqdm.auto import tqdm

from graphllm.compiler import artifact as A
from graphllm.compiler.inductor_lowering import STEP_INDUCTOR, export_step, lower_inductor
from graphllm.compiler.lower import lower, save_node_table
from graphllm.compiler.staging import check_output, publish, staging_dir
from graphllm.compiler.weights_io import write_safetensors
from graphllm.config import CHECKPOINT_QUANTIZATIONS, CompileConfig
from graphllm.device import resolve_device, resolve_dtype
from graphllm.ir import capture, diff_graphs, format_graph
from graphllm.ir.capture import GRAPH_PADDING_SEQS, max_num_logits
from graphllm.models.loader import ModelLoadError, load_checkpoint, read_hf_config, weight_files
from graphllm.models.quantization import read_checkpoint_quantization
from graphllm.passes.base import source_uuid
from graphllm.passes.manager import PassManager, Prequantized
from graphllm.version import __version__

PHASES = ("load", "capture", "passes", "lower", "write")
log = logging.getLogger(__name__)
COPIED_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                "special_tokens_map.json", "chat_template.jinja", "tokenizer.model")


# Modules whose code shapes the compiled step besides the passes (which hash themselves).
# The references are traced into the graph (the decompositions of the norm / SwiGLU ops, the models'
# rotary), quant_layout makes the quantized weights an artifact stores, and this file and artifact.py
# decide what an artifact holds.
COMPILER_MODULES = ("graphllm.ir.capture", "graphllm.ir.graph", "graphllm.compiler.lower",
                    "graphllm.compiler.inductor_lowering", "graphllm.compiler.decompositions",
                    "graphllm.compiler.pipeline", "graphllm.compiler.artifact",
                    "graphllm.ops.attention", "graphllm.ops.collectives", "graphllm.ops.linear",
                    "graphllm.ops.rms_norm", "graphllm.ops.silu_and_mul",
                    "graphllm.ops.quantized_linear", "graphllm.kernels.reference", "graphllm.kernels.rotary",
                    "graphllm.kernels.quant_layout",
                    "graphllm.compiler.weights_io", "graphllm.models.config", "graphllm.models.registry",
                    "graphllm.models.llama", "graphllm.models.layers", "graphllm.models.olmo2", "graphllm.models.phi3",
                    "graphllm.models.moe", "graphllm.models.mixtral", "graphllm.models.qwen3_moe", "graphllm.ops.moe",
                    "graphllm.models.gemma", "graphllm.models.gemma_config", "graphllm.models.deepseek_v2",
                    "graphllm.models.mla", "graphllm.ops.mla_attention", "graphllm.kernels.mla_reference",
                    # the loader and checkpoint conversion decide the weights the artifact stores
                    "graphllm.models.loader", "graphllm.models.checkpoint_parts",
                    "graphllm.models.quantization.parse", "graphllm.models.quantization.scheme",
                    "graphllm.models.quantization.convert", "graphllm.models.quantization.checkpoint",
                    "graphllm.models.quantization.experts")


@functools.cache
def compiler_source_hash() -> str:
    """Hash of the compiler modules' source as loaded by this process (read once)."""
    import importlib
    import inspect
    sources = "".join(inspect.getsource(importlib.import_module(m)) for m in COMPILER_MODULES)
    return hashlib.sha256(sources.encode()).hexdigest()[:16]


def resolve_lowering(config: CompileConfig, device: torch.device) -> str:
    if config.lowering != "auto":
        return config.lowering
    return "inductor" if device.type == "cuda" else "aoti"


def cache_key(model_dir: Path, config: CompileConfig, device: torch.device) -> str:
    """Hash of everything an artifact depends on (see module docstring)."""
    parts = {
        "graphllm": __version__,
        "compile": dataclasses.asdict(config),
        "passes": PassManager(config, planned_prequantized(model_dir)).uuid(),
        "compiler": compiler_source_hash(),
        "model_config": read_hf_config(model_dir),
        "weights": {f.name: A.quick_fingerprint(f) for f in weight_files(model_dir)},
        "environment": A.environment_fingerprint(device),
    }
    if config.tensor_parallel_size > 1:
        from graphllm.passes.parallel.shard_tp import ShardTP
        parts["shard_tp"] = source_uuid(ShardTP.__module__, f"{ShardTP.name}:{ShardTP.version}")
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:20]


def planned_prequantized(model_dir: Path) -> Prequantized | None:
    """The pass plan of a pre-quantized checkpoint before its tensors are read (for the cache key)."""
    found = read_checkpoint_quantization(read_hf_config(model_dir))
    return None if found is None else Prequantized(found.scheme, {})


def checkpoint_quantization(config: CompileConfig, loaded, model_dir: Path) -> Prequantized | None:
    """The pre-quantized checkpoint's linears and experts for the quantization passes (None for a float
    checkpoint), after checking that config.quantization does not ask for something else."""
    asked, found = config.quantization, loaded.quantization
    if found is None:
        if asked in CHECKPOINT_QUANTIZATIONS:
            raise ModelLoadError(f"--quantization {asked} names a pre-quantized checkpoint format, but "
                                 f"{model_dir / 'config.json'} has no quantization_config")
        return None
    if asked is not None and asked != found.method:
        raise ModelLoadError(f"{model_dir} is a {found.method} checkpoint ({found.scheme}); it cannot be quantized "
                             f"again with --quantization {asked}: drop the flag (the checkpoint's scheme is used)")
    if config.quantize_lm_head:  # --quantization fp8 names the fp8 method too: the checkpoint's lm_head is float
        raise ModelLoadError(f"{model_dir} is a pre-quantized {found.method} checkpoint; its lm_head stays as stored: "
                             "drop --quantize-lm-head")
    return Prequantized(found.scheme, loaded.quantized, loaded.experts)


def check_device_runs(scheme: str | None, device: torch.device) -> None:
    """Refuse, with the reason, a scheme whose kernels this GPU cannot run (before any compiling)."""
    if scheme == "fp8" and device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        major, minor = torch.cuda.get_device_capability(device)
        raise ValueError(f"fp8 (W8A8) needs float8 tensor cores, compute capability 8.9 or newer; this GPU "
                         f"is {major}.{minor}: use --quantization int8 or int4")


def quantization_record(config: CompileConfig, loaded, reports, kernels: dict) -> dict | None:
    """What the manifest says about quantization: scheme, where it came from, what the pass changed,
    and which kernel each quantized linear shape runs at each decode bucket."""
    found = loaded.quantization
    if found is None and config.quantization is None:
        return None
    counts = next((r.counts for r in reports if r.name.startswith("quantize_")), {})
    if found is not None:
        return {"scheme": found.scheme, "source": found.method, "group_size": found.group_size, **counts,
                "kernels": kernels}
    return {"scheme": config.quantization, "source": "graphllm compile",
            "group_size": config.quantization_group_size if config.quantization == "int4" else None,
            "lm_head": config.quantize_lm_head, **counts, "kernels": kernels}


QUANTIZED_OPS = {"fp8_linear": ("fp8", 1), "fp8_linear_quantized": ("fp8", 2), "int8_linear": ("int8", 1),
                 "int4_linear": ("int4", 1), "fp8_rms_norm_linear": ("fp8", 3), "fp8_add_rms_norm_linear": ("fp8", 4),
                 "fp8_silu_and_mul_linear": ("fp8", 1), "fp8_gelu_tanh_and_mul_linear": ("fp8", 1),
                 "int4_linear_act_and_mul": ("int4", 1), "int4_linear_add_norm": ("int4", 1),
                 "int4_norm_linear": ("int4", 3), "int4_mma_linear": ("int4_mma", 1)}  # op -> (scheme, weight arg)


def kernel_plan(graph, buckets) -> dict[str, dict[str, str]]:
    """{"<scheme> <N>x<K>": {bucket: kernel}} over the graph's quantized linears (the choice is the op's,
    graphllm/ops/quantized_linear.py kernel_route, from tables measured offline)."""
    from graphllm.ops.quantized_linear import kernel_route
    shapes = set()
    for node in graph.graph.nodes:
        scheme, weight_arg = QUANTIZED_OPS.get(getattr(node.target, "__name__", "").removesuffix(".default"),
                                               (None, 0))
        if scheme:
            qweight = graph.gm.get_parameter(node.args[weight_arg].target)
            if scheme == "int4":
                n, k = qweight.shape[1], qweight.shape[0] * 8
            elif scheme == "int4_mma":  # words [N/16, K/128, 32, 8]
                n, k = qweight.shape[0] * 16, qweight.shape[1] * 128
            else:
                n, k = qweight.shape
            shapes.add((scheme, n, k))
    return {f"{scheme} {n}x{k}": {str(b): kernel_route(scheme, b, n, k, graph.device) for b in buckets}
            for scheme, n, k in sorted(shapes)}


def unquantized_expert_share(graph, config: CompileConfig) -> float | None:
    """With --quantization, the share of the graph's weight bytes that stays float because it is MoE experts
    (fused_moe operands, which the quantization passes do not touch), logged; None without experts or scheme."""
    moe = torch.ops.graphllm.fused_moe.default  # registered by the models (graphllm/models/moe.py)
    experts = [graph.gm.get_parameter(w.target) for node in graph.graph.nodes if node.target is moe
               for w in node.args[2:4]]  # w13, w2
    if config.quantization is None or not experts:
        return None
    size = lambda t: t.numel() * t.element_size()  # noqa: E731
    total = sum(size(t) for t in {t.data_ptr(): t for t in graph.weights.values()}.values())
    share = sum(map(size, experts)) / total
    log.warning("--quantization %s leaves the MoE experts in %s: %.0f%% of the weight bytes stay unquantized "
                "(only --quantization fp8 quantizes the experts)", config.quantization,
                str(experts[0].dtype).removeprefix("torch."), 100 * share)
    return share


def rank_graphs(graph, config: CompileConfig, model_config, prequantized: Prequantized | None,
                dumps: "GraphDumps") -> list[tuple]:
    """[(rank r's graph after the passes, their reports)] for r < tensor_parallel_size. One rank: the graph
    itself. N ranks: shard_tp(r) then the passes over a copy each (weights shared until a pass swaps them);
    every rank's code must come out the same as rank 0's, since one compiled step serves all of them."""
    n = config.tensor_parallel_size
    if n == 1:
        return [(graph, PassManager(config, prequantized).run(graph, dumps.on_pass))]
    from graphllm.passes.parallel.shard_tp import TP_GROUP, ShardTP
    if prequantized is not None:
        raise ValueError("tensor parallelism over a pre-quantized checkpoint is not supported yet: compile the "
                         "float checkpoint with --quantization, or use --tensor-parallel-size 1")
    ranks = []
    for rank in range(n):
        copy = graph.copy_sharing_weights()
        shard = ShardTP.for_model(model_config, rank, n, TP_GROUP)
        reports = PassManager(config, prequantized, shard).run(copy, dumps.on_pass if rank == 0 else None)
        if rank and copy.gm.code != ranks[0][0].gm.code:
            raise RuntimeError(f"shard_tp: rank {rank}'s step differs from rank 0's beyond its weights")
        ranks.append((copy, reports))
    return ranks


class PhaseTimer:
    def __init__(self, show: bool):
        self.seconds: dict[str, float] = {}
        self.bar = tqdm(total=len(PHASES), desc="compile", disable=not show, unit="phase", file=sys.stderr)

    @contextmanager
    def phase(self, name: str):
        self.bar.set_postfix_str(name)
        start = time.perf_counter()
        yield
        self.seconds[name] = round(time.perf_counter() - start, 3)
        self.bar.update(1)

    def summary(self) -> str:
        total = sum(self.seconds.values())
        rows = [f"  {name:<8} {secs:8.2f} s" for name, secs in self.seconds.items()]
        return "\n".join(["phase timings:", *rows, f"  {'total':<8} {total:8.2f} s"])


def save_weights(weights: dict[str, torch.Tensor], path: Path) -> dict[str, str]:
    """Store each distinct tensor once (weights_io, written in parallel); returns alias -> stored name for
    tied weights."""
    stored, aliases, by_ptr = {}, {}, {}
    for name, tensor in weights.items():
        # the same view of the same memory: a transposed square weight or another dtype is not the same tensor
        key = (tensor.data_ptr(), tuple(tensor.shape), tensor.stride(), tensor.dtype)
        if key in by_ptr:
            aliases[name] = by_ptr[key]
        else:
            by_ptr[key] = name
            stored[name] = tensor
    write_safetensors(stored, path)
    return aliases


def tensor_constants(exported: torch.export.ExportedProgram) -> dict[str, torch.Tensor]:
    return {k: v for k, v in exported.constants.items() if isinstance(v, torch.Tensor)}


def save_rank_weights(constants: dict[str, torch.Tensor], ranks: list, out: Path) -> tuple[dict, dict]:
    """Every rank's weights file (the compiled step's constants and the rank graph's weights), each hashed for
    the manifest as soon as it is written; (rank 0's aliases, which tie the same names on every rank, the
    files' manifest records)."""
    aliases, records = {}, {}
    for r, (g, _) in enumerate(ranks):
        name = A.rank_weights(r)
        rank_aliases = save_weights({**constants, **g.weights}, out / name)
        aliases = aliases if r else rank_aliases
        records[name] = A.file_record(out / name)
    return aliases, records


class GraphDumps:
    """graphs/before.txt, after.txt and one NN_<pass>.diff per pass."""

    def __init__(self):
        self.files: dict[str, str] = {}

    def on_pass(self, report, before: str, after: str) -> None:
        self.files[f"{len(self.files) + 1:02d}_{report.name}.diff"] = diff_graphs(before, after)

    def write(self, out: Path, before: tuple[str, str], after: tuple[str, str]) -> None:
        """before/after: (graph text, graph Python code)."""
        graphs = out / "graphs"
        graphs.mkdir(exist_ok=True)
        for stem, (text, code) in (("before", before), ("after", after)):
            (graphs / f"{stem}.txt").write_text(text)
            (graphs / f"{stem}.py").write_text(code)
        for name, text in self.files.items():
            (graphs / name).write_text(text)


def compile_model(model_dir: str | Path, out: str | Path, config: CompileConfig = CompileConfig(),
                  device: str | torch.device = "auto", show_progress: bool = True,
                  command: str | None = None) -> dict:
    """Compile a Hugging Face folder into an artifact directory; returns the manifest."""
    model_dir, out = Path(model_dir), Path(out)
    check_output(out, model_dir)  # before minutes of work, and before anything is replaced
    device = resolve_device(device)
    timer = PhaseTimer(show_progress)
    hf = read_hf_config(model_dir)
    dtype = resolve_dtype(config.dtype, hf, device)
    with timer.phase("load"):
        loaded = load_checkpoint(model_dir, dtype, device, config.max_model_len)
        prequantized = checkpoint_quantization(config, loaded, model_dir)
        check_device_runs(prequantized.scheme if prequantized else config.quantization, device)
    model_config = loaded.config
    with timer.phase("capture"):
        graph = capture(loaded.model, model_config, dtype, device, max_num_tokens=config.max_num_batched_tokens,
                        max_num_seqs=config.max_num_seqs, block_size=config.block_size)
        before = format_graph(graph.gm), graph.gm.code
    del loaded.model  # the graph owns the weights now
    dumps = GraphDumps()
    with timer.phase("passes"):
        ranks = rank_graphs(graph, config, model_config, prequantized, dumps)
        graph, reports = ranks[0]
        unquantized_expert_share(graph, config)
        after = format_graph(graph.gm), graph.gm.code
    staging = staging_dir(out)
    try:  # a failed compile leaves out as it was, and nothing beside it
        lowering = resolve_lowering(config, device)
        writer = ThreadPoolExecutor(1)  # the inductor lowering writes the weights while Inductor runs
        try:
            with timer.phase("lower"):
                if lowering == "aoti":
                    exported, lowered = lower(graph, staging / A.STEP_PACKAGE), {"kind": "aoti"}
                    written = writer.submit(save_rank_weights, tensor_constants(exported), ranks, staging)
                else:
                    exported = export_step(graph)
                    written = writer.submit(save_rank_weights, tensor_constants(exported), ranks, staging)
                    lowered = {"kind": "inductor",
                               "weight_names": lower_inductor(exported, staging / STEP_INDUCTOR, config.inductor_pdl,
                                                               config.persistent_norms)}
            with timer.phase("write"):  # what is left of the weights, then graphs and tokenizer files
                aliases, weight_records = written.result()
                for name in COPIED_FILES:
                    if (model_dir / name).is_file():
                        shutil.copy2(model_dir / name, staging / name)
                dumps.write(staging, before, after)
                save_node_table(exported, staging / "graphs" / "nodes.json")
        finally:
            writer.shutdown(wait=True)  # after an error too: nothing writes into staging once this returns
        manifest = {
            "graphllm_version": __version__,
            "cache_key": cache_key(model_dir, config, device),
            "compile_command": command or f"graphllm compile --model {model_dir} --out {out}",
            "model": {"source": str(model_dir), "config": hf, "architecture": model_config.architecture,
                      "weight_fingerprints": {f.name: A.quick_fingerprint(f) for f in weight_files(model_dir)}},
            "compile": {**dataclasses.asdict(config), "dtype": str(dtype).removeprefix("torch."),
                        "buckets": list(config.decode_buckets),
                        # logits rows one step may return: every token's (speculative decoding's verify rows)
                        "max_num_logits": max_num_logits(config.max_num_batched_tokens),
                        # sequences one step may take: a mixed-step CUDA graph's padding sequence beyond max_num_seqs
                        "max_num_graph_seqs": config.max_num_seqs + GRAPH_PADDING_SEQS},
            "quantization": quantization_record(config, loaded, reports, kernel_plan(graph, config.decode_buckets)),
            "kv_scales": {str(layer): list(scales) for layer, scales in sorted(loaded.kv_scales.items())},
            "tensor_parallel": {"size": config.tensor_parallel_size} if config.tensor_parallel_size > 1 else None,
            "weight_aliases": aliases,
            "lowering": lowered,
            "passes": [dataclasses.asdict(r) for r in reports],
            "environment": A.environment_fingerprint(device),
            "timings": timer.seconds,
        }
        A.write_manifest(staging, manifest, known=weight_records)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    publish(staging, out)
    timer.bar.close()
    if show_progress:
        print(timer.summary(), file=sys.stderr)
    return manifest
