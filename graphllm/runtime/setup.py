"""Builds the runtime pieces from an EngineConfig: model, tokenizer, KV cache, scheduler, runner.

Facts found here (device, dtype, KV-cache dtype, KV blocks, EOS ids, max_model_len) go into
RuntimeState; the EngineConfig is never mutated.
"""

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn

from graphllm.backends import AttentionShape, select_backend, xqa_supports
from graphllm.backends.triton_backend import XQA_SCRATCH_BYTES
from graphllm.config import DEFAULT_LIMITS, EngineConfig, default_buckets
from graphllm.device import resolve_device, resolve_dtype
from graphllm.ir.capture import GRAPH_PADDING_SEQS, StepModule
from graphllm.kernels.kv_quant import FP8_KV_DTYPE, KVScales, is_fp8
from graphllm.kernels.launch import programmatic_launch
from graphllm.models.config import ModelConfig
from graphllm.models.loader import load_model, read_hf_config, read_json_object
from graphllm.runtime.kv_cache import BlockPool, allocate_kv_caches, kv_bytes_per_block
from graphllm.runtime.mixed_graphs import capture_mixed_graphs
from graphllm.runtime.model_runner import ModelRunner
from graphllm.runtime.scheduler import Scheduler

logger = logging.getLogger("graphllm")

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
CPU_KV_CACHE_GIB = 4.0


class Limits(NamedTuple):
    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int


@dataclass(frozen=True)
class RuntimeState:
    model_path: Path
    device: torch.device
    dtype: torch.dtype
    kv_cache_dtype: torch.dtype  # the model's dtype, or float8_e4m3fn (EngineConfig.kv_cache_dtype "fp8")
    max_model_len: int
    num_kv_blocks: int
    kv_cache_bytes: int
    eos_token_ids: frozenset[int]
    model_config: ModelConfig
    limits: Limits
    startup_seconds: dict[str, float] = field(default_factory=dict)  # StartupTimer's phases, in order


class StartupTimer:
    """Seconds per start-up phase: each lap(name) closes the phase that ran since the last one."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = round(now - self.last, 3)
        self.last = now


class Runtime(NamedTuple):
    model: nn.Module | None  # None when running a compiled artifact
    tokenizer: Any
    state: RuntimeState
    pool: BlockPool
    scheduler: Scheduler
    runner: ModelRunner


def resolve_model_path(model: str | None) -> Path:
    """A model folder, or None: the built-in demo model."""
    if model is not None:
        return Path(model).expanduser()
    from graphllm.demo import DEMO_MODEL_DIR
    return Path(DEMO_MODEL_DIR)


def resolve_kv_cache_dtype(config: EngineConfig, dtype: torch.dtype) -> torch.dtype:
    """auto: the model's dtype; fp8: float8_e4m3fn, K/V stored with per-tensor KVScales per layer (vLLM's)."""
    return FP8_KV_DTYPE if config.kv_cache_dtype == "fp8" else dtype


def load_tokenizer(path: Path):
    if not any((path / f).is_file() for f in TOKENIZER_FILES):
        return None
    from transformers import AutoTokenizer
    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:  # a damaged tokenizer file, named
        raise ValueError(f"the tokenizer files of {path} do not load: {type(e).__name__}: {e}") from e


def use_chat_template(tokenizer, value: str, path: Path) -> None:
    """EngineConfig.chat_template in place of the tokenizer's own: `value` is a file's path (its text is the
    template) or the template itself, as vLLM's --chat-template reads it. It must render a one-message
    conversation; else, as where the folder has no tokenizer, a ValueError says why at load."""
    source = "--chat-template"
    try:
        named = "\n" not in value and Path(value).expanduser().is_file()
    except OSError:  # a template too long to be a path
        named = False
    if named:
        source = f"--chat-template {value}"
        text = Path(value).expanduser().read_text(encoding="utf-8", errors="strict")
    elif "{" not in value:
        raise ValueError(f"--chat-template {value!r} is neither a file nor a Jinja template")
    else:
        text = value
    if tokenizer is None:
        raise ValueError(f"{source}: {path} has no tokenizer files to apply a chat template with")
    try:
        tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], chat_template=text, tokenize=False,
                                      add_generation_prompt=True)
    except Exception as e:  # noqa: BLE001 - jinja2's syntax and undefined errors, a template's raise_exception
        raise ValueError(f"{source} does not render a one-message conversation: {type(e).__name__}: {e}") from e
    tokenizer.chat_template = text


def eos_token_ids(path: Path, model_config: ModelConfig, tokenizer) -> frozenset[int]:
    ids = set(model_config.eos_token_ids)
    gen_file = path / "generation_config.json"
    if gen_file.is_file():
        eos = read_json_object(gen_file).get("eos_token_id")
        ids |= set(eos if isinstance(eos, list) else [] if eos is None else [eos])
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return frozenset(ids)


def resolve_max_model_len(config: EngineConfig, model_config: ModelConfig) -> int:
    limit = model_config.max_positions  # an artifact compiled with LongRoPE's short factors: fewer
    if config.max_model_len is None:
        return limit
    if config.max_model_len > model_config.max_position_embeddings:
        raise ValueError(f"max_model_len={config.max_model_len} exceeds the model's "
                         f"max_position_embeddings={model_config.max_position_embeddings}")
    if config.max_model_len > limit:
        raise ValueError(f"max_model_len={config.max_model_len} needs LongRoPE's long factors past "
                         f"original_max_position_embeddings={limit}; this artifact was compiled with the short "
                         f"ones: recompile with --max-model-len {config.max_model_len}")
    return config.max_model_len


def resolve_num_blocks(config: EngineConfig, limits: Limits, model_config: ModelConfig,
                       kv_cache_dtype: torch.dtype, device: torch.device, max_model_len: int,
                       reserved: int = 0) -> int:
    """config.num_kv_blocks, else as many as the KV memory budget holds in kv_cache_dtype (capped
    at every sequence at full length); `reserved`: bytes the engine allocates after the cache (kv_cache_budget)."""
    block_size = limits.block_size
    if config.num_kv_blocks is not None:
        num_blocks = config.num_kv_blocks
    else:
        per_block = kv_bytes_per_block(model_config, block_size, kv_cache_dtype)
        wanted = limits.max_num_seqs * -(-max_model_len // block_size)  # every sequence at full length
        num_blocks = min(wanted, kv_cache_budget(config, device, reserved) // per_block)
    if num_blocks * block_size < max_model_len:
        raise ValueError(f"the KV cache holds {num_blocks * block_size} tokens, fewer than "
                         f"max_model_len={max_model_len}: give more KV memory or a smaller max_model_len")
    return num_blocks


def kv_cache_budget(config: EngineConfig, device: torch.device, reserved: int = 0) -> int:
    """The KV cache's bytes: config.kv_cache_memory_gib, else 4 GiB on the CPU, else on a GPU gpu_kv_budget of
    what is free now (the weights loaded), less `reserved` (a buffer the engine allocates after the cache: XQA's
    scratch)."""
    if config.kv_cache_memory_gib is not None:
        return int(config.kv_cache_memory_gib * 2**30)
    if device.type == "cpu":
        return int(CPU_KV_CACHE_GIB * 2**30)
    free, total = torch.cuda.mem_get_info(device)
    return gpu_kv_budget(free, total, config.gpu_memory_utilization, reserved)


def gpu_kv_budget(free: int, total: int, utilization: float, reserved: int = 0) -> int:
    """What a GPU with `free` of `total` bytes free gives the KV cache when the engine may hold `utilization` of
    it (vLLM's --gpu-memory-utilization): the free bytes less the share it must leave, less `reserved`. The
    share left (10% by default) also holds the step's activations and the CUDA graphs, allocated later. None
    left is an error that names the numbers and the two flags that change them."""
    budget = int(free - (1 - utilization) * total) - reserved
    if budget <= 0:
        gib = 2**30
        raise ValueError(f"no GPU memory left for the KV cache: {free / gib:.2f} GiB of {total / gib:.2f} GiB are "
                         f"free with the model loaded, and --gpu-memory-utilization {utilization:g} leaves "
                         f"{(1 - utilization) * total / gib:.2f} GiB to other uses"
                         + (f" and {reserved / gib:.2f} GiB to attention scratch" if reserved else "")
                         + ": raise --gpu-memory-utilization, or give --kv-cache-memory-gib")
    return budget


def reserved_after_kv_cache(config: EngineConfig, kv_dtype: torch.dtype, device: torch.device) -> int:
    """Bytes allocated after the KV cache is sized that its budget leaves free: XQA's scratch where a float8
    cache's decode may take it (EngineConfig.xqa_decode not False; whether it runs is known only after the
    cache exists, so where it then does not, the cache is 256 MiB smaller than it could be)."""
    if device.type != "cuda" or config.xqa_decode is False or not is_fp8(kv_dtype):
        return 0
    return XQA_SCRATCH_BYTES


XQA_PAGE_SIZES = (16, 32, 64, 128)  # flashinfer.xqa's page_size choices


def resolve_xqa_decode(wanted: bool | None, backend, shape: AttentionShape, device: torch.device,
                       kv_dtype: torch.dtype, dtype: torch.dtype, block_size: int) -> bool:
    """Whether the triton backend's float8 decode goes through flashinfer.xqa (EngineConfig.xqa_decode): never with
    False; with True wherever it can run and builds, else a ValueError saying why; with None (the default) the
    same, except that where it cannot run it is off, and where it cannot build (no nvcc, a FlashInfer without the
    kernel) off with a warning."""
    why = xqa_supports(backend.name, shape, device, kv_dtype)
    if why is None and block_size not in XQA_PAGE_SIZES:
        why = f"its pages are {', '.join(map(str, XQA_PAGE_SIZES))} tokens, not --block-size {block_size}"
    if why is None and dtype not in (torch.bfloat16, torch.float16):
        why = f"its queries are bfloat16 or float16, not {dtype}"
    if wanted and why is not None:
        raise ValueError(f"xqa_decode is unavailable: {why}")
    if why is not None or wanted is False:
        return False
    why = backend.probe_xqa(shape.num_heads, shape.num_kv_heads, shape.head_dim, block_size, dtype, device)
    if why is not None and wanted:
        raise ValueError(f"xqa_decode is unavailable: flashinfer.xqa did not build or run here: {why}")
    if why is not None:
        logger.warning("float8 KV cache decode: flashinfer.xqa did not build or run here (%s); graphllm's split "
                       "kernel takes every decode launch (--no-xqa-decode says so and skips the attempt)", why)
    return why is None


def build_runtime(config: EngineConfig) -> Runtime:
    """Eager from a model folder, or compiled from an artifact (config.artifact or config.compile)."""
    if config.artifact is not None:
        return build_compiled_runtime(config, Path(config.artifact))
    path = resolve_model_path(config.model)
    device = resolve_device(config.device)
    if config.tensor_parallel_size > 1 and not (config.compile or is_quantized(config, path)):
        return build_tensor_parallel_runtime(config, path, device)
    if config.compile or is_quantized(config, path):  # quantization is a compiler pass: no eager path
        if not config.compile:
            logger.info("%s: quantized models run compiled; compiling (or reusing the cached artifact)", path)
        from graphllm.compiler.cache import compiled_artifact
        art = compiled_artifact(path, config.compile_config(), device, config.artifact_cache)
        return build_compiled_runtime(config, art)
    dtype = resolve_dtype(config.dtype, read_hf_config(path), device)
    model, model_config = load_model(path, dtype, device, config.max_model_len)
    return assemble(config, resolve_limits(config), path, model, model_config, StepModule(model), dtype, device)



def build_tensor_parallel_runtime(config: EngineConfig, path: Path, device: torch.device) -> Runtime:
    """Rank 0 of an N-way tensor-parallel engine run eager, each rank reading its slices of the checkpoint
    (compile=True and quantized models take the compiled path: build_compiled_runtime)."""
    check_tensor_parallel_runs(config, device)
    from graphllm.passes.parallel.shard_tp import TP_GROUP, ShardTP
    from graphllm.models.registry import resolve_architecture
    from graphllm.runtime.tensor_parallel import RankStep, start_tensor_parallel
    hf = read_hf_config(path)
    dtype = resolve_dtype(config.dtype, hf, device)
    _, model_config = resolve_architecture(hf)
    n = config.tensor_parallel_size
    ShardTP.for_model(model_config, 0, n, TP_GROUP, eager=True)  # before any process starts: what it cannot shard
    step, local = start_tensor_parallel(n, RankStep(str(path), False, dtype), dtype,
                                        init_method=config.distributed_init_method)
    return assemble(config, resolve_limits(config), path, None, local, step, dtype, device)


def run_worker_rank(config: EngineConfig, rank: int) -> None:
    """Rank `rank` (> 0) of a tensor-parallel engine whose rank 0 runs elsewhere (torchrun): build this rank's
    step from the artifact (compiled) or the model folder (eager), then serve rank 0's steps until it stops."""
    from graphllm.runtime.tensor_parallel import RankStep, worker_main
    device = resolve_device(config.device)
    check_tensor_parallel_runs(config, device)
    if config.artifact is not None:
        from graphllm.compiler.artifact import verify_artifact
        manifest = verify_artifact(Path(config.artifact), device, defer_weights=True)
        ranks = artifact_ranks(config, manifest, Path(config.artifact))
        dtype = getattr(torch, manifest["compile"]["dtype"])
        rank_step = RankStep(config.artifact, True, dtype)
    elif not config.compile:
        path = resolve_model_path(config.model)
        ranks, dtype = config.tensor_parallel_size, resolve_dtype(config.dtype, read_hf_config(path), device)
        rank_step = RankStep(str(path), False, dtype)
    else:
        raise ValueError("a worker rank runs an artifact or an eager (compile=False) model, not compile=True")
    worker_main(rank, ranks, config.distributed_init_method, rank_step, dtype)


def check_tensor_parallel_runs(config: EngineConfig, device: torch.device) -> None:
    """What tensor parallelism does not run with yet, refused by name."""
    unsupported = [why for cond, why in ((device.type != "cpu", f"device {device.type} (NCCL is not wired yet)"),
                                         (config.kv_cache_dtype != "auto", "an fp8 KV cache")) if cond]
    if unsupported:
        raise ValueError(f"tensor_parallel_size {config.tensor_parallel_size} runs on the CPU (gloo) for now; "
                         f"not with {', '.join(unsupported)}")


def is_quantized(config: EngineConfig, path: Path) -> bool:
    """Asked to quantize, or a pre-quantized checkpoint (config.json has a quantization_config)."""
    return config.quantization is not None or "quantization_config" in read_hf_config(path)


def build_compiled_runtime(config: EngineConfig, art: Path) -> Runtime:
    """Load a compiled artifact: its weights, its step package; no code generation."""
    from graphllm.compiler.artifact import verify_artifact
    from graphllm.compiler.loading import load_compiled_step
    device = resolve_device(config.device)
    timer = StartupTimer()
    manifest = verify_artifact(art, device, defer_weights=True)  # load_compiled_step checks them as it reads
    timer.lap("verify")
    model_config, weights, step = load_compiled_step(art, manifest, device, lap=timer.lap)
    dtype = getattr(torch, manifest["compile"]["dtype"])  # not a weight's: quantized ones are int/float8
    check_quantization_matches(config, manifest, art)
    check_dtype_matches(config, manifest, art)
    limits = resolve_limits(config, manifest["compile"])
    buckets = tuple(b for b in manifest["compile"]["buckets"] if b <= limits.max_num_seqs)
    ranks = artifact_ranks(config, manifest, art)
    if ranks > 1:  # rank 0 broadcasts each step's inputs from the host: no CUDA graphs yet
        check_tensor_parallel_runs(config, device)
        from graphllm.runtime.tensor_parallel import RankStep, local_model_config, start_tensor_parallel
        step, model_config = start_tensor_parallel(ranks, RankStep(str(art), True, dtype), dtype,
                                                   (step, local_model_config(model_config, ranks)),
                                                   config.distributed_init_method)
    return assemble(config, limits, art, None, model_config, step, dtype, device, buckets,
                    checkpoint_kv_scales(manifest), timer, max_num_logits=compiled_max_num_logits(manifest),
                    max_graph_seqs=compiled_max_graph_seqs(manifest))


def artifact_ranks(config: EngineConfig, manifest: dict, art: Path) -> int:
    """The artifact's tensor-parallel size; asking for another one (other than the default 1) is an error."""
    ranks = (manifest.get("tensor_parallel") or {}).get("size", 1)
    asked = config.tensor_parallel_size
    if asked != 1 and asked != ranks:
        raise ValueError(f"artifact {art} was compiled for tensor_parallel_size {ranks}; it cannot run at {asked}: "
                         f"recompile with graphllm compile --tensor-parallel-size {asked}")
    return ranks


def check_dtype_matches(config: EngineConfig, manifest: dict, art: Path) -> None:
    """The same for the dtype (s35's fuzzing: `--artifact A --dtype bfloat16` ran A's float32 without a word)."""
    built = manifest["compile"]["dtype"]
    if config.dtype != "auto" and config.dtype != built:
        raise ValueError(f"artifact {art} was compiled for dtype {built}; it cannot run as {config.dtype}: recompile "
                         f"with graphllm compile --dtype {config.dtype}, or leave --dtype out")


def check_quantization_matches(config: EngineConfig, manifest: dict, art: Path) -> None:
    """An artifact runs as it was compiled: asking for another quantization is an error, not ignored."""
    built = manifest.get("quantization") or {}
    if config.quantization is not None and config.quantization not in (built.get("scheme"), built.get("source")):
        raise ValueError(f"artifact {art} was compiled with quantization {built.get('scheme')}; it cannot run as "
                         f"{config.quantization}: recompile with graphllm compile --quantization {config.quantization}")


def checkpoint_kv_scales(manifest: dict) -> list[KVScales] | None:
    """The checkpoint's per-layer k_scale / v_scale (compressed-tensors kv_cache_scheme), None without."""
    scales = manifest.get("kv_scales") or {}
    return [KVScales(*scales[str(i)]) for i in range(len(scales))] or None


def resolve_limits(config: EngineConfig, built: dict | None = None) -> Limits:
    """Scheduler limits: what config asks, else the artifact's (`built`), else DEFAULT_LIMITS.

    A compiled step accepts at most its compiled sizes, and its block size is fixed.
    """
    values = {}
    for name, default in DEFAULT_LIMITS.items():
        asked, limit = getattr(config, name), (built or {}).get(name)
        if limit is not None and asked is not None and (asked > limit or name == "block_size" and asked != limit):
            raise ValueError(f"{name}={asked} does not fit the artifact, compiled with {name}={limit}; "
                             f"recompile with --{name.replace('_', '-')} {asked}")
        values[name] = asked if asked is not None else limit if limit is not None else default
    return Limits(**values)


def compiled_max_num_logits(manifest: dict) -> int:
    """The logits rows an artifact's step returns at most: recorded since verify steps sample every token;
    an older artifact's sampled-rows dimension was bounded by its max_num_seqs."""
    return manifest["compile"].get("max_num_logits", manifest["compile"]["max_num_seqs"])


def compiled_max_graph_seqs(manifest: dict) -> int:
    """The most sequences an artifact's step takes: one more than its max_num_seqs since mixed-step graphs pad
    with a sequence of their own (ir.capture.GRAPH_PADDING_SEQS); an older artifact's, its max_num_seqs."""
    return manifest["compile"].get("max_num_graph_seqs", manifest["compile"]["max_num_seqs"])


def assemble(config: EngineConfig, limits: Limits, path: Path, model: nn.Module | None,
             model_config: ModelConfig, step, dtype: torch.dtype, device: torch.device,
             buckets: tuple[int, ...] | None = None, layer_kv_scales: list[KVScales] | None = None,
             timer: StartupTimer | None = None, max_num_logits: int | None = None,
             max_graph_seqs: int | None = None) -> Runtime:
    """The parts eager and compiled engines share: tokenizer, KV cache, scheduler, runner.

    max_num_logits: the most logits rows the step returns (a compiled step's sampled-rows dimension is
    bounded: compiled_max_num_logits); None: no limit. Only speculative proposals can reach it.
    max_graph_seqs: the most sequences the step takes (a compiled step's: compiled_max_graph_seqs), which bounds
    the padding sequences of mixed-step graphs; None: no limit.

    The compiled step takes a KV cache of any element type (the attention op, an opaque call in
    the graph, is all that reads or writes it), so one artifact serves both kv_cache_dtype values.
    """
    timer = timer or StartupTimer()
    tokenizer = load_tokenizer(path)
    if config.chat_template is not None:
        use_chat_template(tokenizer, config.chat_template, path)
    timer.lap("tokenizer")
    max_model_len = resolve_max_model_len(config, model_config)
    kv_dtype = resolve_kv_cache_dtype(config, dtype)
    num_blocks = resolve_num_blocks(config, limits, model_config, kv_dtype, device, max_model_len,
                                    reserved_after_kv_cache(config, kv_dtype, device))
    # one block more than the pool hands out: padded CUDA-graph rows write their K/V there
    kv_caches = allocate_kv_caches(model_config, num_blocks + 1, limits.block_size, kv_dtype, device)
    kv_bytes = sum(c.numel() * c.element_size() for c in kv_caches)
    torch.manual_seed(config.seed)
    state = RuntimeState(path, device, dtype, kv_dtype, max_model_len, num_blocks, kv_bytes,
                         eos_token_ids(path, model_config, tokenizer), model_config, limits, timer.seconds)
    timer.lap("kv_cache")
    pool = BlockPool(num_blocks, limits.block_size, config.enable_prefix_caching)
    scheduler = Scheduler(pool, limits.max_num_seqs, limits.max_num_batched_tokens, max_num_logits)
    shape = attention_shape(model_config)
    # ignored unless the cache is fp8 (as vLLM); an fp8 MLA cache is refused by select_backend below
    if config.calculate_kv_scales and kv_dtype != dtype and not shape.mla:
        from graphllm.runtime.kv_calibration import calculate_kv_scales
        layer_kv_scales = calculate_kv_scales(step, model_config, tokenizer, shape, dtype, device, limits.block_size)
        logger.info("fp8 KV cache scales from a calibration prefill, per layer: k %s, v %s",
                    [round(s.k, 4) for s in layer_kv_scales], [round(s.v, 4) for s in layer_kv_scales])
    # the largest scales for a cache no layer claims (none in practice: the step hands each layer's own)
    widest = KVScales(*(max(s) for s in zip(*layer_kv_scales))) if layer_kv_scales else KVScales()
    backend = select_backend(config.attention_backend, shape, dtype, device, limits.block_size, kv_dtype, widest)
    if backend.name == "triton":  # its decode kernel can take rope_store_kv's work (TritonBackend.fuse_rope_decode)
        backend.fuse_rope_decode = config.fuse_rope_decode
    if resolve_xqa_decode(config.xqa_decode, backend, shape, device, kv_dtype, dtype, limits.block_size):
        backend.xqa_decode, backend.xqa_mixed = True, config.xqa_mixed
    elif config.xqa_mixed:
        raise ValueError("xqa_mixed sends a mixed step's decodes through XQA decode, which does not run here "
                         "(--xqa-decode says why): drop --xqa-mixed")
    if layer_kv_scales is not None:
        backend.bind_layer_scales(kv_caches, layer_kv_scales)
    logger.info("attention backend: %s%s", backend.name, " (float8 decode launches where q is rounded to float8: "
                "TensorRT-LLM's XQA, flashinfer.xqa)" if getattr(backend, "xqa_decode", False) else "")
    graphs, verify_graphs, mixed = None, [], None
    if device.type == "cuda" and config.cuda_graphs:
        buckets, max_blocks = buckets or default_buckets(limits.max_num_seqs), -(-max_model_len // limits.block_size)
        with programmatic_launch(config.enable_pdl):  # the graphs keep the launches' programmatic edges
            if config.cudagraph_mode == "FULL":  # first: the largest activations, whose pool the rest share
                seqs = limits.max_num_seqs + GRAPH_PADDING_SEQS
                seqs = min(seqs, max_graph_seqs or seqs)
                mixed = capture_mixed_graphs(step, kv_caches, config, limits, seqs, max_blocks, num_blocks, device,
                                             backend)
            graphs = capture_graphs(step, kv_caches, buckets, max_blocks, num_blocks, limits.block_size, device,
                                    backend, pool=mixed.pool if mixed else None)
            spec = config.speculative_config
            if spec is not None and not backend.plans_on_host:  # FlashInfer's plans cannot be replayed so
                rows = min(limits.max_num_batched_tokens, max_num_logits or limits.max_num_batched_tokens)
                for q in verify_sizes(spec.num_speculative_tokens):
                    if fitting := verify_buckets(buckets, q, rows):
                        verify_graphs.append(capture_graphs(step, kv_caches, fitting, max_blocks, num_blocks,
                                                            limits.block_size, device, backend, tokens_per_seq=q,
                                                            pool=graphs.pool))
    timer.lap("graphs")
    runner = ModelRunner(step, kv_caches, limits.block_size, device, graphs, backend, verify_graphs, mixed)
    logger.info("start-up phases (s): %s", ", ".join(f"{k} {v:.2f}" for k, v in timer.seconds.items()))
    return Runtime(model, tokenizer, state, pool, scheduler, runner)


def attention_shape(model_config: ModelConfig) -> AttentionShape:
    """The model's attention for the backends: its layers' window, scale and soft cap where they all agree;
    where they differ (Gemma's sliding and global layers) the first layer's, and uniform False."""
    layers = {(model_config.window_of(i), model_config.attention_scale, model_config.attn_logit_softcapping)
              for i in range(model_config.num_hidden_layers)}
    window, scale, softcap = next(iter(layers)) if len(layers) == 1 else (
        model_config.window_of(0), model_config.attention_scale, model_config.attn_logit_softcapping)
    return AttentionShape(model_config.num_attention_heads, model_config.num_key_value_heads, model_config.head_dim,
                          window, softcap, scale, uniform=len(layers) == 1, mla=model_config.is_mla)


def capture_graphs(step, kv_caches, buckets, max_blocks_per_seq: int, padding_block: int, block_size: int,
                   device, backend, tokens_per_seq: int = 1, pool=None):
    from graphllm.runtime.cudagraphs import CUDAGraphRunner
    graphs = CUDAGraphRunner(step, kv_caches, buckets, max_blocks_per_seq, padding_block, block_size, device,
                             backend, tokens_per_seq)
    graphs.pool = pool  # the decode graphs' pool: a speculative engine's steps never overlap (no async)
    graphs.capture()
    logger.info("captured %d %s CUDA graphs (buckets %s) in %.2f s; they hold %.3f GiB", len(graphs.graphs),
                "decode" if tokens_per_seq == 1 else f"verify ({tokens_per_seq} tokens a sequence)",
                list(graphs.buckets), graphs.capture_seconds, graphs.pool_bytes / 2**30)
    return graphs


VERIFY_SIZES = (2, 3, 5, 9, 17)  # tokens a sequence of the verify graphs below k + 1 (each also captures k + 1)


def verify_sizes(num_speculative_tokens: int) -> tuple[int, ...]:
    """The q (tokens a sequence) of the verify graphs a speculative engine captures, ascending: k + 1 and the
    VERIFY_SIZES below it. A verify step replays the smallest q that holds its longest sequence, so steps with
    few proposals (prompt lookup often finds none or one) are padded to 2 or 3 tokens a sequence, not to k + 1."""
    k1 = num_speculative_tokens + 1
    return tuple(q for q in VERIFY_SIZES if q < k1) + (k1,)


def verify_buckets(buckets: tuple[int, ...], tokens_per_seq: int, max_rows: int) -> tuple[int, ...]:
    """The decode buckets whose verify steps (tokens_per_seq rows a sequence) fit max_rows tokens and logits."""
    return tuple(b for b in buckets if b * tokens_per_seq <= max_rows)
