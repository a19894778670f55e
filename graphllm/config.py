"""EngineConfig and CompileConfig: the frozen configuration objects, built at the entry point and
passed down.

Unknown options are an error (the dataclass constructor refuses them). Facts found at run
time (KV blocks, EOS ids, resolved lengths) live in the engine's RuntimeState, not here. Nothing
here reads the environment: the CLI entry (graphllm/cli) does, once, and fills these fields.
"""

from dataclasses import dataclass
from pathlib import Path

from graphllm.speculative_config import SpeculativeConfig, as_speculative_config

DTYPES = ("auto", "float32", "bfloat16", "float16")
LOWERINGS = ("auto", "aoti", "inductor")
ATTENTION_BACKENDS = ("auto", "flashinfer", "triton", "torch")
KV_CACHE_DTYPES = ("auto", "fp8")  # auto: the model's dtype; fp8: float8_e4m3fn with a per-tensor scale
# which steps replay CUDA graphs (vLLM's compilation_config.cudagraph_mode values): decode steps only, or
# every step up to max_cudagraph_capture_size tokens, prefill and mixed ones too (graphllm/runtime/mixed_graphs.py)
CUDAGRAPH_MODES = ("FULL_DECODE_ONLY", "FULL")
# FULL by default since 2026-12-01 (H200, same call, 8B preset): throughput 10,072 -> 10,967 output tok/s, a
# batch-1 prefill of 128 tokens 42.0 -> 7.9 ms, decode unchanged; it costs ~1.0 s of start-up and its graphs
# share the decode graphs' pool (0.672 GiB together). Backends that cannot capture such steps fall back to
# decode-only graphs with a warning (benchmarks/RESULTS.md, "Twentieth session")
DEFAULT_CUDAGRAPH_MODE = "FULL"
DEFAULT_MAX_CUDAGRAPH_CAPTURE_SIZE = 2048  # tokens
# Quantization schemes applied by the compiler to a float checkpoint (vLLM's names where it has them):
# fp8 = W8A8 (float8 weights per channel, activations per token), int8 / int4 = weight-only
QUANTIZATIONS = ("fp8", "int8", "int4")
# The methods of pre-quantized checkpoints (config.json's quantization_config.quant_method): read
# from the checkpoint with no flag; naming one checks that the checkpoint is of that method.
CHECKPOINT_QUANTIZATIONS = ("compressed-tensors", "gptq", "awq")
DEFAULT_QUANTIZATION_GROUP_SIZE = 128  # int4's, when quantizing a float checkpoint
DEFAULT_LIMITS = {"max_num_seqs": 64, "max_num_batched_tokens": 2048, "block_size": 16}
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default
DEFAULT_CACHE_DIR = Path.home() / ".cache" / "graphllm"  # compiled artifacts go under <cache_dir>/artifacts


@dataclass(frozen=True)
class EngineConfig:
    model: str | None = None  # Hugging Face folder; None = the built-in demo model
    artifact: str | None = None  # a `graphllm compile` output directory (instead of model)
    compile: bool = False  # compile model into the artifact cache (or reuse it) before serving
    dtype: str = "auto"  # auto: float32 on CPU, the checkpoint's dtype on GPU
    device: str = "auto"  # auto: cuda when available, else cpu
    # None below: the artifact's value when loading one, else the DEFAULT_LIMITS
    max_num_seqs: int | None = None  # sequences in one batch
    max_num_batched_tokens: int | None = None  # token budget of one step (prefill chunks share it)
    block_size: int | None = None  # tokens per KV-cache block
    max_model_len: int | None = None  # prompt + output; None = the model's max positions
    num_kv_blocks: int | None = None  # None = sized from kv_cache_memory_gib
    kv_cache_memory_gib: float | None = None  # None: 4 GiB on CPU, on a GPU what gpu_memory_utilization leaves
    # GPU: the share of the GPU's memory this engine may hold (vLLM's --gpu-memory-utilization): the KV cache takes
    # what is free after the weights, less the rest of the GPU's memory (1 - this), which keeps room for the
    # step's activations and CUDA graphs (the 8B preset's graphs together: 0.67 GiB) and other processes
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION
    seed: int = 0  # for unseeded sampling
    cuda_graphs: bool = True  # replay decode steps from CUDA graphs (GPU only)
    # with cuda_graphs: FULL_DECODE_ONLY graphs decode steps; FULL also steps that carry prompt tokens, one graph
    # per token bucket up to max_cudagraph_capture_size tokens (None: min(2048, max_num_batched_tokens)), each
    # step padded to its bucket (mixed_token_buckets). FULL needs an attention backend that captures such
    # steps (triton; others graph decode steps only)
    cudagraph_mode: str = DEFAULT_CUDAGRAPH_MODE
    max_cudagraph_capture_size: int | None = None
    # sm_90+: the decode graphs launch graphllm's decode-step kernels (the linears, rope + KV store, decode
    # attention) as programmatic dependents (PDL), so that each starts, prefetches its weight and waits while the
    # kernel before finishes (graphllm/kernels/launch.py); compile=True also builds Inductor's kernels for it
    # (CompileConfig.inductor_pdl). On by default (H200, same-call A/Bs: fp8 W8A8 +5.8% at batch 1 and +5.0% at
    # 16, Phi-3-mini +1.8%, Llama-3-8B bf16 within 0.6%: benchmarks/RESULTS.md, s25); off: --no-enable-pdl
    enable_pdl: bool = True
    # triton attention at decode: the split kernel rotates q and k and stores the new token's KV itself
    # (graphllm/kernels/rope_decode.py), instead of rope_store_kv's launch before it; changes no value (the GPU
    # tests: the same teacher-forced rows) and measured 1.0% faster at batch 1 and 8 (benchmarks/RESULTS.md, s22)
    fuse_rope_decode: bool = True
    # triton attention, a float8 cache: decode launches where the split kernel would round q to float8 run
    # rope_store_kv, then TensorRT-LLM's XQA decode kernel as FlashInfer builds it (flashinfer.xqa, sm_90+;
    # TritonBackend._runs_xqa). None (the default): wherever it can run (xqa_supports) and builds here
    # (TritonBackend.probe_xqa), else the split kernel, logged; True: required (refused where it cannot run);
    # False: never. Measured on the H100: +3.75% fp8 W8A8 + fp8 KV throughput at 256 sequences, +8.6% at 512
    # (s36-s37); it rounds P to float8 too (~2.4 points of teacher-forced agreement on the test model)
    xqa_decode: bool | None = None
    # with XQA decode on, a mixed step's decodes go to XQA too (TritonBackend.xqa_mixed): +2.4% fp8 throughput on an
    # H100 (1,024 requests, 256 sequences), and ~1.3 ms more for a prompt-only step (XQA over the graph's padding
    # sequences), so off by default: for offline throughput (benchmarks/RESULTS.md, s38)
    xqa_mixed: bool = False
    # auto: triton on CUDA (measured faster than flashinfer), else flashinfer; torch (the reference) on CPU
    attention_backend: str = "auto"
    # decode steps run back to back per schedule when every row is plain greedy, each feeding its
    # argmax to the next on the device, with one host sync for all (see StepLoop._decode_steps)
    num_decode_steps: int = 1
    # schedule and launch step N + 1 before reading back step N's tokens, so the host's work
    # (scheduling, inputs, stop checks, detokenizing) overlaps the GPU's (see StepLoop)
    async_scheduling: bool = True
    # automatic prefix caching (vLLM's): full KV blocks stay cached by a chained hash of their tokens,
    # shared by reference count and evicted least recently freed first (graphllm/runtime/kv_cache.py)
    enable_prefix_caching: bool = True
    kv_cache_dtype: str = "auto"  # one of KV_CACHE_DTYPES
    cache_dir: str | None = None  # where compile=True keeps its artifacts; None: DEFAULT_CACHE_DIR
    # compile=True: the CompileConfig switches of the same names (see there)
    fuse_rope_attention: bool = True
    skinny_linear: bool = True
    linear_prologue: bool = True
    linear_epilogue: bool | None = None
    row_sumsq: bool | None = None
    shared_norm_prologue: bool = False
    fuse_moe_router: bool = False
    fp8_linear_prologue: bool = False
    persistent_norms: bool = True
    int4_mma: bool = False
    quantization: str | None = None
    quantization_group_size: int = DEFAULT_QUANTIZATION_GROUP_SIZE
    quantize_lm_head: bool = False
    # fp8 KV cache: scales from the K and V amax of one calibration prefill at start-up (vLLM's
    # --calculate-kv-scales), instead of a checkpoint's k_scale / v_scale or 1.0
    calculate_kv_scales: bool = False
    # ranks of a tensor-parallel engine on this node (vLLM's --tensor-parallel-size), eager or compiled
    # (graphllm/runtime/tensor_parallel.py); an artifact compiled for N ranks runs at N
    tensor_parallel_size: int = 1
    # where ranks 1..N-1 started elsewhere (torchrun, on this node or others) meet rank 0, e.g.
    # tcp://host:port; None: the engine starts them itself on this node
    distributed_init_method: str | None = None
    # a Jinja chat template used instead of the tokenizer's own (vLLM's --chat-template): its text, or a file holding
    # it; for a model folder without one, or to change it. Checked at load by rendering a one-message conversation
    chat_template: str | None = None
    # speculative decoding (vLLM's speculative_config): a dict of SpeculativeConfig's fields, e.g.
    # {"method": "ngram", "num_speculative_tokens": 4} or {"model": DRAFT_DIR, "num_speculative_tokens": 4};
    # kept as a SpeculativeConfig (graphllm/speculative_config.py; the decoder: graphllm/runtime/spec_decode/)
    speculative_config: SpeculativeConfig | dict | None = None

    def __post_init__(self):
        object.__setattr__(self, "speculative_config", as_speculative_config(self.speculative_config))
        if self.speculative_config is not None and self.num_decode_steps > 1:
            raise ValueError("speculative_config and num_decode_steps > 1 do not combine: each is a way of "
                             "producing several tokens per schedule; choose one")
        check_quantization(self.quantization, self.quantization_group_size, self.quantize_lm_head)
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {self.kv_cache_dtype!r}")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(f"attention_backend must be one of {ATTENTION_BACKENDS}, got {self.attention_backend!r}")
        for name in DEFAULT_LIMITS:
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.cudagraph_mode not in CUDAGRAPH_MODES:
            raise ValueError(f"cudagraph_mode must be one of {CUDAGRAPH_MODES}, got {self.cudagraph_mode!r}")
        if self.max_cudagraph_capture_size is not None and self.max_cudagraph_capture_size < 2:
            raise ValueError(f"max_cudagraph_capture_size must be >= 2, got {self.max_cudagraph_capture_size}")
        if self.num_decode_steps < 1:
            raise ValueError(f"num_decode_steps must be >= 1, got {self.num_decode_steps}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks must be >= 1, got {self.num_kv_blocks}")
        if self.kv_cache_memory_gib is not None and not self.kv_cache_memory_gib > 0:
            raise ValueError(f"kv_cache_memory_gib must be > 0, got {self.kv_cache_memory_gib}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization is a share of the GPU's memory, in (0, 1], got "
                             f"{self.gpu_memory_utilization}")
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")

    def compile_config(self) -> "CompileConfig":
        """What compile=True compiles with: these limits (where given) and pass switches."""
        limits = {name: getattr(self, name) for name in DEFAULT_LIMITS if getattr(self, name) is not None}
        return CompileConfig(dtype=self.dtype, max_model_len=self.max_model_len,
                             fuse_rope_attention=self.fuse_rope_attention, skinny_linear=self.skinny_linear,
                             linear_prologue=self.linear_prologue, linear_epilogue=self.linear_epilogue,
                             row_sumsq=self.row_sumsq, shared_norm_prologue=self.shared_norm_prologue,
                             fuse_moe_router=self.fuse_moe_router, fp8_linear_prologue=self.fp8_linear_prologue,
                             int4_mma=self.int4_mma,
                             inductor_pdl=self.enable_pdl, persistent_norms=self.persistent_norms,
                             quantization=self.quantization,
                             quantization_group_size=self.quantization_group_size,
                             quantize_lm_head=self.quantize_lm_head,
                             tensor_parallel_size=self.tensor_parallel_size, **limits)

    @property
    def artifact_cache(self) -> Path:
        """The directory of compile=True's artifacts, one per cache key."""
        return Path(self.cache_dir or DEFAULT_CACHE_DIR).expanduser() / "artifacts"


def check_quantization(quantization: str | None, group_size: int, lm_head: bool) -> None:
    """The quantization switches; those that would be ignored (they only steer the compiler's own quantizing of a
    float checkpoint) are refused by name."""
    choices = QUANTIZATIONS + CHECKPOINT_QUANTIZATIONS
    if quantization is not None and quantization not in choices:
        raise ValueError(f"quantization must be one of {', '.join(choices)} (or None), got {quantization!r}")
    if group_size < 8 or group_size % 8:
        raise ValueError(f"quantization_group_size must be a positive multiple of 8, got {group_size}")
    if group_size != DEFAULT_QUANTIZATION_GROUP_SIZE and quantization != "int4":
        raise ValueError(f"quantization_group_size ({group_size}) applies to quantization int4 only, got quantization "
                         f"{quantization!r} (a pre-quantized checkpoint keeps its own group size)")
    if lm_head and quantization not in QUANTIZATIONS:
        raise ValueError(f"quantize_lm_head applies to quantization {', '.join(QUANTIZATIONS)} only, got quantization "
                         f"{quantization!r} (a pre-quantized checkpoint keeps lm_head as it stores it)")


def default_buckets(max_num_seqs: int) -> tuple[int, ...]:
    """Decode batch sizes that get a CUDA graph: 1, 2, 4, 8, then every 16 up to max_num_seqs."""
    small = [b for b in (1, 2, 4, 8) if b <= max_num_seqs]
    return tuple(small + list(range(16, max_num_seqs + 1, 16)))


def mixed_token_buckets(max_tokens: int) -> tuple[int, ...]:
    """Token counts that get a mixed-step CUDA graph (cudagraph_mode FULL): 32, 64, 128, every 128 up to 1024,
    every 256 beyond it, and max_tokens itself, none above max_tokens. A step pads up to the next one, so the
    spacing bounds the wasted tokens: an eighth or less of a step from 256 tokens on."""
    ladder = [32, 64] + list(range(128, 1025, 128)) + list(range(1280, max_tokens + 1, 256))
    return tuple(sorted({t for t in ladder if t < max_tokens} | {max_tokens}))


@dataclass(frozen=True)
class CompileConfig:
    """What `graphllm compile` bakes into an artifact; its fields enter the artifact's cache key."""

    dtype: str = "auto"
    max_num_seqs: int = DEFAULT_LIMITS["max_num_seqs"]
    max_model_len: int | None = None
    max_num_batched_tokens: int = DEFAULT_LIMITS["max_num_batched_tokens"]
    block_size: int = DEFAULT_LIMITS["block_size"]
    buckets: tuple[int, ...] | None = None  # None: default_buckets(max_num_seqs)
    fuse_qkv: bool = True
    fuse_gate_up: bool = True
    fuse_silu_mul: bool = True
    fuse_add_rmsnorm: bool = True
    # GPU graphs: linears of decode batches <= 16 on graphllm's skinny_matmul kernel (False: every
    # linear stays aten.linear, which Inductor hands to cuBLAS; was GRAPHLLM_SKINNY_MATMUL=0)
    skinny_linear: bool = True
    # GPU graphs: norms and SwiGLU folded into the linear they feed, one launch at batch 1 (needs
    # skinny_linear; False: they run as their own kernels; was GRAPHLLM_FUSED_PROLOGUE=0)
    linear_prologue: bool = True
    # GPU graphs: SwiGLU / GeGLU in gate_up's own launch (its epilogue, over gate_up's rows interleaved) instead of
    # down's prologue or a kernel of its own (needs skinny_linear; graphllm/passes/lowering/linear_epilogue.py).
    # None (the default): over int4 gate_ups only (with row_sumsq, +4.5% int4 batch-1 decode on an H100, s44;
    # bf16's A/Bs measured it neutral)
    linear_epilogue: bool | None = None
    # GPU graphs: at 1-8 rows the product before an add_rms_norm computes the norm's row statistics in its epilogue
    # and the next product normalises with them: no norm kernel between them at 2-8 rows, no read of the row
    # before the weight stream at one (needs linear_prologue; graphllm/passes/lowering/row_sumsq.py). None (the
    # default): the int4 pairs only (an add_rms_norm between two int4 linears; bf16's measured 2.6% slower at batch 8)
    row_sumsq: bool | None = None
    # GPU graphs: a norm read by a linear and by other ops (a MoE layer's router and experts) folds into that linear,
    # whose one-row launch stores the norm's output for the others: no norm kernel of its own at batch 1 (needs
    # linear_prologue; graphllm/passes/lowering/shared_norm_prologue.py)
    shared_norm_prologue: bool = False
    # GPU graphs: a MoE layer's router linear moves into its experts' op, whose one-token launch computes the logits
    # and chooses the experts (one launch where the router's GEMV and the routing kernel were two; needs
    # skinny_linear; graphllm/passes/lowering/fuse_moe_router.py)
    fuse_moe_router: bool = False
    # GPU graphs, fp8 W8A8: the norms and SwiGLU fold into the fp8 linears they feed too, so that at one row
    # the fp8 kernel computes them, the row's scale and the float8 operand itself (no norm + quantize kernel,
    # no silu_and_mul_fp8); other rows run the norm's own kernel, then fp8_linear, instead of Inductor's fused
    # norm + quantize. Off by default: measured slower at batch 1 on the H200 (282.2 tok/s against 309.5, 2026-11-29,
    # benchmarks/RESULTS.md; needs linear_prologue)
    fp8_linear_prologue: bool = False
    # GPU graphs, int4: plain int4 linears read their weight in the tensor-core kernel's layout (kernels/int4_mma.py,
    # graphllm/passes/lowering/int4_mma_layout.py) and run it up to 16 rows; turns the int4 folds' default off.
    # Opt-in and not yet run on a GPU (s44)
    int4_mma: bool = False
    # GPU graphs: q/k rotary inside the attention op's KV write, one Triton launch instead of two
    # rotary kernels and store_kv (was GRAPHLLM_FUSED_ROPE=1). On by default since the fifteenth
    # session: on the H200 its launch without fp contraction gives the unfused path's bf16
    # teacher-forced agreement exactly, and decode was 1.2-1.8% faster (benchmarks/RESULTS.md)
    fuse_rope_attention: bool = True
    lowering: str = "auto"  # "aoti" | "inductor"; auto: AOTInductor on CPU, Inductor standalone on CUDA
    # Inductor lowering on sm_90+: its Triton kernels generated for programmatic dependent launch too (Inductor's
    # triton.enable_pdl, where this torch has it), so that the engine's PDL chain runs through them
    # (EngineConfig.enable_pdl sets it when the engine compiles; on by default, as that is)
    inductor_pdl: bool = True
    # Inductor lowering: a row reduction of up to PERSISTENT_ROW_NUMEL elements (an 8B model's 4,096-wide norms,
    # and the fp8 linears' norm + per-token quantization Inductor fuses with them) as a persistent reduction, the
    # row read once into registers, instead of Inductor's looped one past 1,024 (which reads the row once a
    # loop: at 4,096 rows the 8B's norm + quantize kernels stream at ~40% of the H200's copy rate, s32). On by
    # default since s39's H100 A/B: fp8 batch 1 +2.9-3.1% (the norm + quantize kernels read their 4,096-wide row once),
    # int4 batch 1 +2.0%, bf16 and the throughput run level (graphllm/compiler/inductor_lowering.py's persistent_rows)
    persistent_norms: bool = True
    # One of QUANTIZATIONS: the quantize_<scheme> pass rewrites every linear but lm_head (None: the
    # checkpoint's own quantization_config if it has one, else none). CHECKPOINT_QUANTIZATIONS names
    # are accepted when they match the checkpoint.
    quantization: str | None = None
    quantization_group_size: int = DEFAULT_QUANTIZATION_GROUP_SIZE  # int4: input columns per scale and zero point
    quantize_lm_head: bool = False  # quantize lm_head too (the embedding always stays in the model dtype)
    # N > 1: the shard_tp pass makes one step per rank (their weights; the code is the same for all)
    tensor_parallel_size: int = 1

    def __post_init__(self):
        check_quantization(self.quantization, self.quantization_group_size, self.quantize_lm_head)
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size"):  # as EngineConfig's (s35's fuzzing:
            if getattr(self, name) < 1:  # --max-num-seqs 0 wrote an artifact of no buckets)
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
        if self.buckets is not None and (not self.buckets or min(self.buckets) < 1
                                         or max(self.buckets) > self.max_num_seqs):
            raise ValueError(f"buckets must be batch sizes in [1, max_num_seqs={self.max_num_seqs}], "
                             f"got {self.buckets}")
        if self.lowering not in LOWERINGS:
            raise ValueError(f"lowering must be one of {LOWERINGS}, got {self.lowering!r}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be at least "
                             f"max_num_seqs ({self.max_num_seqs}): a decode step has one token per sequence")

    @property
    def decode_buckets(self) -> tuple[int, ...]:
        return tuple(sorted(self.buckets)) if self.buckets else default_buckets(self.max_num_seqs)
