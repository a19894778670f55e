"""The shared test backend for passes: tiny captured graphs, fresh random step inputs, and a
check that a pass leaves the computed function unchanged (logits and KV-cache writes)."""

import contextlib
import copy
import functools
import random
import tempfile
from pathlib import Path

import torch

from graphllm.backends import TorchBackend
from graphllm.ops.attention import use_backend
from graphllm.ir import StepGraph, capture, op_counts
from graphllm.models import load_model
from tests.tiny_models import make_hf_model, save_model_folder

BLOCK_SIZE, NUM_BLOCKS = 16, 32


@functools.lru_cache(maxsize=None)
def _captured(arch: str, dtype: torch.dtype):
    folder = save_model_folder(make_hf_model(arch), Path(tempfile.mkdtemp()) / arch)
    model, config = load_model(folder, dtype=dtype)
    return capture(model, config, dtype, torch.device("cpu")), config


def tiny_step_graph(arch: str = "llama", dtype: torch.dtype = torch.float32):
    """(a private copy of the captured StepGraph of a tiny random `arch` model, its ModelConfig)."""
    graph, config = _captured(arch, dtype)
    return copy_graph(graph), config


def copy_graph(graph: StepGraph) -> StepGraph:
    return StepGraph(copy.deepcopy(graph.gm), graph.example_inputs, graph.dynamic_shapes)


def random_step_inputs(config, seed: int, dtype: torch.dtype = torch.float32, num_seqs: int = 3) -> tuple:
    """A mixed step: each sequence has a random cached context and 1..6 new tokens; random KV contents."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    free = list(range(NUM_BLOCKS))
    rng.shuffle(free)
    ids, pos, slots, tables, lens, starts, sample = [], [], [], [], [], [0], []
    for i in range(num_seqs):
        cached, new = rng.randint(0, 40), 1 if i == 0 else rng.randint(1, 6)
        total = cached + new
        blocks = [free.pop() for _ in range(-(-total // BLOCK_SIZE))]
        ids += [rng.randrange(config.vocab_size) for _ in range(new)]
        pos += range(cached, total)
        slots += [blocks[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(cached, total)]
        tables.append(blocks)
        lens.append(total)
        starts.append(starts[-1] + new)
        sample.append(starts[-1] - 1)
    width = max(map(len, tables))
    tables = [t + [0] * (width - len(t)) for t in tables]
    shape = config.kv_cache_shape(NUM_BLOCKS, BLOCK_SIZE)
    caches = [torch.randn(shape, generator=gen).to(dtype) for _ in range(config.num_hidden_layers)]
    t = lambda v: torch.tensor(v, dtype=torch.int64)  # noqa: E731
    return t(ids), t(pos), t(slots), t(tables), t(lens), t(starts), t(sample), caches


@contextlib.contextmanager
def on_reference():
    """Run graphs and models as the tests here do: no autograd, the reference backend running the
    attention op (outside a backend's scope the op refuses to run)."""
    with torch.no_grad(), use_backend(TorchBackend()):
        yield


def clone_inputs(inputs: tuple) -> tuple:
    return (*inputs[:-1], [c.clone() for c in inputs[-1]])


def assert_same_function(before: StepGraph, after: StepGraph, config, seeds=(1, 2, 3),
                         dtype: torch.dtype = torch.float32, atol: float = 1e-5) -> None:
    """Both graphs give the same logits and write the same KV cache on fresh random inputs."""
    for seed in seeds:
        inputs = random_step_inputs(config, seed, dtype)
        a_in, b_in = clone_inputs(inputs), clone_inputs(inputs)
        with on_reference():
            a, b = before(*a_in), after(*b_in)
        torch.testing.assert_close(b, a, atol=atol, rtol=1e-4)
        for ca, cb in zip(a_in[-1], b_in[-1]):
            torch.testing.assert_close(cb, ca, atol=atol, rtol=1e-4)


def run_pass(pass_, arch: str = "llama", dtype: torch.dtype = torch.float32):
    """Apply pass_ to a fresh tiny graph: (before, after, counts, op counts before, op counts after, config)."""
    after, config = tiny_step_graph(arch, dtype)
    before = copy_graph(after)
    counts = pass_(after)
    return before, after, counts, op_counts(before.gm), op_counts(after.gm), config


def split_nodes(graph: StepGraph) -> list:
    return [n for n in graph.graph.nodes if n.target is torch.ops.aten.split_with_sizes.default]


def total_elements(graph: StepGraph) -> int:
    """Elements over distinct tensors: tied weights are listed under each name but stored once."""
    return sum(numel for _, numel in {(t.data_ptr(), t.numel()) for t in graph.weights.values()})


def dequantized_twin(before: StepGraph, after: StepGraph) -> StepGraph:
    """A copy of `before` (unquantized) whose linear weights are the dequantized weights of `after`
    (the same graph after a quantization pass, before any fusion): what the quantized model means."""
    from graphllm.kernels import quant_layout as Q
    twin = copy_graph(before)
    quantized = after.weights
    for name, weight in twin.weights.items():
        prefix = name.removesuffix(".weight")
        if not name.endswith(".weight") or f"{prefix}.qweight" not in quantized:
            continue
        q = lambda t: quantized[f"{prefix}.{t}"]  # noqa: E731
        if f"{prefix}.zeros" in quantized:
            dense = Q.dequantize_int4(q("qweight"), q("scales"), q("zeros"))
        else:
            dense = Q.dequantize_per_channel(q("qweight"), q("weight_scale"))
        weight.copy_(dense.to(weight.dtype))
    return twin


def logits_relative_error(before: StepGraph, after: StepGraph, config, seed: int = 1) -> float:
    """|after - before| / |before| over the logits of one random step (norms over all elements)."""
    inputs = random_step_inputs(config, seed)
    with on_reference():
        a, b = before(*clone_inputs(inputs)), after(*clone_inputs(inputs))
    return ((b - a).norm() / a.norm()).item()


def static_fp8_checkpoint(graph: StepGraph, input_scale: float = 0.05) -> dict:
    """What a compressed-tensors FP8 checkpoint with static activation scales unpacks to, for the graph's
    linears: {module path: qweight, weight_scale, input_scale}."""
    from graphllm.kernels import quant_layout as Q
    checkpoint = {}
    for name, w in graph.weights.items():
        if name.endswith("_proj.weight"):
            qweight, scale = Q.quantize_fp8_weight(w)
            checkpoint[name.removeprefix("model.").removesuffix(".weight")] = {
                "qweight": qweight, "weight_scale": scale, "input_scale": torch.tensor([input_scale])}
    return checkpoint
