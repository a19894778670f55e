"""Command-line flags shared by the commands (generate, serve, compile, bench), and the configs they build."""

import argparse
import dataclasses
import json

from graphllm.config import (ATTENTION_BACKENDS, CHECKPOINT_QUANTIZATIONS, CUDAGRAPH_MODES, DEFAULT_CUDAGRAPH_MODE,
                             DEFAULT_GPU_MEMORY_UTILIZATION, DEFAULT_LIMITS, DEFAULT_QUANTIZATION_GROUP_SIZE, DTYPES,
                             KV_CACHE_DTYPES, QUANTIZATIONS, CompileConfig, EngineConfig)
from graphllm.runtime.sampling_params import SamplingParams

SAMPLING_FLAGS = {  # flag -> (type, SamplingParams field)
    "--max-tokens": (int, "max_tokens"), "--min-tokens": (int, "min_tokens"),
    "--temperature": (float, "temperature"), "--top-p": (float, "top_p"), "--top-k": (int, "top_k"),
    "--min-p": (float, "min_p"), "--repetition-penalty": (float, "repetition_penalty"),
    "--presence-penalty": (float, "presence_penalty"), "--frequency-penalty": (float, "frequency_penalty"),
    "--seed": (int, "seed"), "--n": (int, "n"), "--logprobs": (int, "logprobs"),
}
# CompileConfig / EngineConfig fields that change the generated code
PASS_SWITCHES = ("fuse_rope_attention", "skinny_linear", "linear_prologue", "linear_epilogue", "row_sumsq",
                 "shared_norm_prologue", "fuse_moe_router", "fp8_linear_prologue", "persistent_norms", "int4_mma",
                 "quantization", "quantization_group_size", "quantize_lm_head", "tensor_parallel_size")


def add_model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="Hugging Face model folder (default: the built-in demo model)")
    parser.add_argument("--dtype", default="auto", choices=DTYPES)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--max-model-len", type=int)
    parser.add_argument("--max-num-seqs", type=int)
    parser.add_argument("--max-num-batched-tokens", type=int)
    parser.add_argument("--block-size", type=int, help=f"tokens per KV-cache block (default "
                        f"{DEFAULT_LIMITS['block_size']}; an artifact runs with the block size it was compiled for)")
    add_pass_flags(parser)


def add_pass_flags(parser: argparse.ArgumentParser) -> None:
    """The compile passes' switches (CompileConfig's fields; they change the generated code)."""
    parser.add_argument("--fuse-rope-attention", action=argparse.BooleanOptionalAction, default=True,
                        help="GPU graphs: rotate q/k inside the attention op's KV-cache write, one launch (on by "
                             "default; --no-fuse-rope-attention: Inductor's rotary kernels and store_kv)")
    parser.add_argument("--no-skinny-linear", dest="skinny_linear", action="store_false",
                        help="GPU graphs: every linear on cuBLAS (no skinny_matmul kernel, no prologues)")
    parser.add_argument("--no-linear-prologue", dest="linear_prologue", action="store_false",
                        help="GPU graphs: norms and SwiGLU as their own kernels, not folded into the next matmul")
    parser.add_argument("--linear-epilogue", action=argparse.BooleanOptionalAction, default=None,
                        help="GPU graphs: SwiGLU / GeGLU in gate_up's own matmul launch, not in down_proj's prologue "
                             "(batch 1) or a kernel of its own, over an interleaved gate_up weight (default: int4 "
                             "gate_ups only; measured neutral for bf16 on an H100)")
    parser.add_argument("--row-sumsq", action=argparse.BooleanOptionalAction, default=None,
                        help="GPU graphs: at 1-8 rows (1-16 between int4 matmuls), o_proj and down_proj compute the next "
                             "RMSNorm's row statistics in their epilogue, and the next matmul normalises with them (no "
                             "norm kernel between; default: between int4 matmuls only; bf16 measured 2.6%% slower at "
                             "batch 8 on an H100)")
    parser.add_argument("--shared-norm-prologue", action=argparse.BooleanOptionalAction, default=False,
                        help="GPU graphs: a norm read by a matmul and by other ops (a MoE layer's router and experts) "
                             "runs in that matmul's launch at batch 1, which stores its output for the others (off by "
                             "default: measured neutral on an H200)")
    parser.add_argument("--fuse-moe-router", action=argparse.BooleanOptionalAction, default=False,
                        help="GPU graphs: a MoE layer's router matmul runs inside its experts' op, one launch with the "
                             "expert choice at batch 1 (off by default: not yet measured on a GPU)")
    parser.add_argument("--persistent-norms", action=argparse.BooleanOptionalAction, default=True,
                        help="GPU graphs: Inductor's row reductions up to 8,192 wide (the norms, with an fp8 linear's "
                             "per-token quantization) read their row once, as persistent reductions (on by default: "
                             "fp8 batch 1 +3%% on an H100)")
    parser.add_argument("--fp8-linear-prologue", action="store_true",
                        help="GPU graphs, fp8: fold norms and SwiGLU into the fp8 linears too (one launch at batch 1 "
                             "that also quantizes the activation; off by default: measured slower on an H200)")
    parser.add_argument("--int4-mma", action="store_true",
                        help="GPU graphs, int4: plain int4 linears in the tensor-core kernel's weight layout "
                             "(kernels/int4_mma.py) up to 16 rows, without the int4 folds (opt-in: not yet measured)")
    parser.add_argument("--quantization", "-q", choices=QUANTIZATIONS + CHECKPOINT_QUANTIZATIONS,
                        help="quantize the linears of a float checkpoint: fp8 (W8A8: float8 weights per channel, "
                             "activations per token), int8 or int4 (weight-only). A pre-quantized checkpoint "
                             f"({', '.join(CHECKPOINT_QUANTIZATIONS)}) needs no flag: config.json says")
    parser.add_argument("--quantization-group-size", type=int, default=DEFAULT_QUANTIZATION_GROUP_SIZE,
                        help="int4: input columns per scale and zero point (default 128)")
    parser.add_argument("--quantize-lm-head", action="store_true",
                        help="quantize lm_head too (by default it stays in the model dtype, as the embedding)")
    parser.add_argument("--tensor-parallel-size", "-tp", type=int, default=1,
                        help="shard the model over this many ranks (processes joined by torch.distributed; for "
                             "now on the CPU, gloo); an artifact compiled for N ranks runs at N")


def pass_switches(args: argparse.Namespace) -> dict[str, bool]:
    return {name: getattr(args, name) for name in PASS_SWITCHES}


def add_runtime_flags(parser: argparse.ArgumentParser) -> None:
    """Engine options that the serving commands and the benchmarks share."""
    parser.add_argument("--no-async-scheduling", dest="async_scheduling", action="store_false",
                        help="read back each step's tokens before scheduling the next (no host/GPU overlap)")
    parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                        help="reuse the KV blocks of prompt prefixes seen before (on by default; "
                             "--no-enable-prefix-caching turns it off)")
    parser.add_argument("--kv-cache-dtype", default="auto", choices=KV_CACHE_DTYPES,
                        help="auto: the model's dtype; fp8: float8_e4m3fn (half the KV bytes)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=DEFAULT_GPU_MEMORY_UTILIZATION,
                        help="GPU: the share of the GPU's memory the engine may hold; the KV cache takes what is "
                             "free after the weights less the rest (default %(default)s, as vLLM's)")
    parser.add_argument("--kv-cache-memory-gib", type=float,
                        help="the KV cache's size in GiB, instead of --gpu-memory-utilization's share (default on "
                             "the CPU: 4)")
    parser.add_argument("--num-gpu-blocks-override", type=int, metavar="N",
                        help="exactly N KV-cache blocks, whatever the memory (vLLM's flag; for tests and A/Bs)")
    parser.add_argument("--calculate-kv-scales", action="store_true",
                        help="fp8 KV cache: scales from the K/V amax of a calibration prefill at start-up "
                             "(default: the checkpoint's k_scale/v_scale, else 1.0)")
    parser.add_argument("--enable-pdl", action=argparse.BooleanOptionalAction, default=True,
                        help="GPU (sm_90+): decode graphs launch the decode step's kernels as programmatic "
                             "dependents, each starting while the one before finishes (the default; "
                             "--no-enable-pdl: plain launches)")
    parser.add_argument("--fuse-rope-decode", action=argparse.BooleanOptionalAction, default=True,
                        help="triton attention: at decode the attention kernel rotates q and k and writes the new "
                             "token's KV itself, one kernel a layer fewer (the default; --no-fuse-rope-decode: "
                             "rope_store_kv, then attention)")
    parser.add_argument("--xqa-decode", action=argparse.BooleanOptionalAction, default=None,
                        help="triton attention, sm_90+, --kv-cache-dtype fp8: the decode launches where graphllm's "
                             "split kernel would round q to float8 (128-wide heads, 256+ sequence x KV-head "
                             "programs) run rope_store_kv, then TensorRT-LLM's XQA decode kernel as FlashInfer "
                             "builds it (flashinfer.xqa), which rounds P to float8 as well (layers with a soft cap or "
                             "a sliding window keep the split kernel). Default: wherever it can run and builds; "
                             "--xqa-decode: required; --no-xqa-decode: never")
    parser.add_argument("--xqa-mixed", action="store_true",
                        help="with XQA decode: a mixed step's decodes through XQA too (offline throughput: +2.4%% fp8 "
                             "on an H100; a step with prompts and no decodes takes ~1 ms longer)")
    parser.add_argument("--cudagraph-mode", default=DEFAULT_CUDAGRAPH_MODE, choices=CUDAGRAPH_MODES,
                        help="GPU: which steps replay CUDA graphs: FULL (the default): steps with prompt tokens "
                             "too, up to --max-cudagraph-capture-size tokens (triton attention; other backends "
                             "decode steps only), or FULL_DECODE_ONLY")
    parser.add_argument("--max-cudagraph-capture-size", type=int, metavar="N",
                        help="--cudagraph-mode FULL: the largest step, in tokens, that replays a graph (default: "
                             "2048, at most --max-num-batched-tokens)")
    parser.add_argument("--speculative-config", type=json_object, metavar="JSON",
                        help='speculative decoding (vLLM\'s), e.g. \'{"method": "ngram", "num_speculative_tokens": 4, '
                             '"prompt_lookup_max": 4, "prompt_lookup_min": 2}\' or \'{"model": "DRAFT_DIR", '
                             '"num_speculative_tokens": 4}\'')


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    add_model_args(parser)
    parser.add_argument("--artifact", help="run a `graphllm compile` artifact instead of --model")
    parser.add_argument("--eager", action="store_true", help="run the model uncompiled (no artifact cache)")
    parser.add_argument("--attention-backend", default="auto", choices=ATTENTION_BACKENDS,
                        help="auto: triton on a GPU (measured fastest), else flashinfer; torch on CPU")
    parser.add_argument("--num-decode-steps", type=int, default=1,
                        help="greedy decode steps run back to back per schedule, one host sync for all "
                             "(tokens then stream in bursts of this many)")
    parser.add_argument("--chat-template", metavar="FILE_OR_TEMPLATE",
                        help="a Jinja chat template (a file, or the template itself) instead of the tokenizer's own")
    add_runtime_flags(parser)


def engine_config(args: argparse.Namespace) -> EngineConfig:
    if args.artifact and args.model:  # the artifact would run, and the model folder be silently ignored
        raise ValueError("give --model (a Hugging Face folder) or --artifact (a compiled artifact), not both")
    if args.artifact and args.eager:
        raise ValueError("--eager runs a model folder uncompiled; an --artifact is compiled code: give one of them")
    config = EngineConfig(model=args.model, artifact=args.artifact, compile=not args.eager and not args.artifact,
                          dtype=args.dtype, device=args.device, max_model_len=args.max_model_len,
                          max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                          block_size=args.block_size, attention_backend=args.attention_backend,
                          chat_template=args.chat_template, num_decode_steps=args.num_decode_steps,
                          async_scheduling=args.async_scheduling, kv_cache_dtype=args.kv_cache_dtype,
                          enable_prefix_caching=args.enable_prefix_caching, enable_pdl=args.enable_pdl,
                          fuse_rope_decode=args.fuse_rope_decode, xqa_decode=args.xqa_decode, xqa_mixed=args.xqa_mixed,
                          cudagraph_mode=args.cudagraph_mode,
                          max_cudagraph_capture_size=args.max_cudagraph_capture_size,
                          calculate_kv_scales=args.calculate_kv_scales, cache_dir=getattr(args, "cache_dir", None),
                          **memory_options(args),
                          speculative_config=getattr(args, "speculative_config", None), **pass_switches(args))
    torchrun = getattr(args, "torchrun", None)
    return config if torchrun is None else under_torchrun(config, torchrun)


def memory_options(args: argparse.Namespace) -> dict:
    """EngineConfig's KV-cache sizing from add_runtime_flags' flags."""
    return {"gpu_memory_utilization": args.gpu_memory_utilization, "kv_cache_memory_gib": args.kv_cache_memory_gib,
            "num_kv_blocks": args.num_gpu_blocks_override}


def json_object(text: str) -> dict:
    """--speculative-config's value: a JSON object (its keys are checked by SpeculativeConfig)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON ({e}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def under_torchrun(config: EngineConfig, torchrun) -> EngineConfig:
    """The config of one rank of a torchrun launch: every torchrun process is a rank of one tensor-parallel
    engine (rank 0 serves), meeting at torchrun's address."""
    if config.tensor_parallel_size != torchrun.world_size:
        raise ValueError(f"torchrun started {torchrun.world_size} processes; give --tensor-parallel-size "
                         f"{torchrun.world_size} (got {config.tensor_parallel_size})")
    if config.compile:
        raise ValueError("under torchrun, compile first (graphllm compile --tensor-parallel-size N --out ART) "
                         "and run --artifact ART, or run --eager")
    return dataclasses.replace(config, distributed_init_method=torchrun.init_method)


def compile_config(args: argparse.Namespace) -> CompileConfig:
    given = {k: getattr(args, k) for k in ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "block_size")}
    return CompileConfig(dtype=args.dtype, buckets=tuple(args.buckets) if args.buckets else None,
                         inductor_pdl=getattr(args, "enable_pdl", True),
                         **{k: v for k, v in given.items() if v is not None}, **pass_switches(args))


def add_sampling_args(parser: argparse.ArgumentParser) -> None:
    for flag, (kind, _) in SAMPLING_FLAGS.items():
        parser.add_argument(flag, type=kind)
    parser.add_argument("--stop", action="append", help="stop string (repeatable)")
    parser.add_argument("--ignore-eos", action="store_true")


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    given = {field: getattr(args, flag[2:].replace("-", "_")) for flag, (_, field) in SAMPLING_FLAGS.items()}
    given = {k: v for k, v in given.items() if v is not None}
    given.setdefault("max_tokens", 64)
    given.setdefault("temperature", 0.0)
    return SamplingParams(stop=args.stop, ignore_eos=args.ignore_eos, **given)
