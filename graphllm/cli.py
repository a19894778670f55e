"""The `graphllm` command line: generate, serve, compile, inspect, bench."""

import argparse
import asyncio
import json
import sys

from graphllm.bench import latency, serve_bench, throughput
from graphllm.server.cli import add_serve_parser
from graphllm.config import ATTENTION_BACKENDS, CompileConfig, EngineConfig, add_runtime_flags
from graphllm.runtime.sampling_params import SamplingParams

SAMPLING_FLAGS = {  # flag -> (type, SamplingParams field)
    "--max-tokens": (int, "max_tokens"), "--min-tokens": (int, "min_tokens"),
    "--temperature": (float, "temperature"), "--top-p": (float, "top_p"), "--top-k": (int, "top_k"),
    "--min-p": (float, "min_p"), "--repetition-penalty": (float, "repetition_penalty"),
    "--presence-penalty": (float, "presence_penalty"), "--frequency-penalty": (float, "frequency_penalty"),
    "--seed": (int, "seed"), "--n": (int, "n"), "--logprobs": (int, "logprobs"),
}


def add_model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="Hugging Face model folder (default: the built-in demo model)")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--max-model-len", type=int)
    parser.add_argument("--max-num-seqs", type=int)
    parser.add_argument("--max-num-batched-tokens", type=int)


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    add_model_args(parser)
    parser.add_argument("--artifact", help="run a `graphllm compile` artifact instead of --model")
    parser.add_argument("--eager", action="store_true", help="run the model uncompiled (no artifact cache)")
    parser.add_argument("--attention-backend", default="auto", choices=ATTENTION_BACKENDS,
                        help="auto: triton on a GPU (measured fastest), else flashinfer; torch on CPU")
    parser.add_argument("--num-decode-steps", type=int, default=1,
                        help="greedy decode steps run back to back per schedule, one host sync for all "
                             "(tokens then stream in bursts of this many)")
    add_runtime_flags(parser)


def engine_config(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(model=args.model, artifact=args.artifact, compile=not args.eager and not args.artifact,
                        dtype=args.dtype, device=args.device, max_model_len=args.max_model_len,
                        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                        attention_backend=args.attention_backend, num_decode_steps=args.num_decode_steps,
                        async_scheduling=args.async_scheduling, kv_cache_dtype=args.kv_cache_dtype)


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


def cmd_generate(args: argparse.Namespace) -> int:
    from graphllm.runtime.engine import Engine
    params = sampling_params(args)
    engine = Engine(engine_config(args))
    use_chat = not args.raw and getattr(engine.tokenizer, "chat_template", None)
    prompt = engine.apply_chat_template([{"role": "user", "content": args.prompt}]) if use_chat else args.prompt
    if args.stream:
        return asyncio.run(stream_to_stdout(engine, prompt, params))
    for completion in engine.generate(prompt, params)[0].outputs:
        if args.json:
            print(json.dumps({"index": completion.index, "text": completion.text,
                              "token_ids": completion.token_ids, "finish_reason": completion.finish_reason}))
        else:
            print(completion.text)
    return 0


async def stream_to_stdout(engine, prompt, params: SamplingParams) -> int:
    async for out in engine.stream(prompt, params):
        sys.stdout.write(out.outputs[0].delta_text)
        sys.stdout.flush()
    print()
    return 0


def cmd_compile(args: argparse.Namespace) -> int:
    from graphllm.compiler.pipeline import compile_model
    from graphllm.runtime.setup import resolve_model_path
    given = {k: getattr(args, k) for k in ("max_num_seqs", "max_num_batched_tokens", "max_model_len")}
    config = CompileConfig(dtype=args.dtype, buckets=tuple(args.buckets) if args.buckets else None,
                           **{k: v for k, v in given.items() if v is not None})
    model_dir = resolve_model_path(EngineConfig(model=args.model))
    manifest = compile_model(model_dir, args.out, config, args.device, command=" ".join(["graphllm", *sys.argv[1:]]))
    print(f"artifact written to {args.out} (cache key {manifest['cache_key']})")
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from pathlib import Path
    from graphllm.compiler import inspection
    from graphllm.compiler.artifact import read_manifest
    art = Path(args.artifact)
    manifest = read_manifest(art)
    if args.kernel:
        print(inspection.kernel_source(art, args.kernel))
        return 0
    if args.dump:
        written = inspection.dump(art, Path(args.dump), manifest)
        print(f"wrote {len(written)} files under {args.dump}")
        return 0
    print(f"{art}: {manifest['model']['architecture']}, dtype {manifest['compile']['dtype']}, "
          f"buckets {manifest['compile']['buckets']}, compiled for {manifest['environment']['device_name']}\n")
    print(inspection.format_passes(manifest) + "\n")
    print(inspection.format_kernels(inspection.kernels_with_sources(art)))
    return 0


def cmd_bench_compile(args: argparse.Namespace) -> int:
    from graphllm.bench.compile_bench import main as bench_main
    return bench_main(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="graphllm", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    add_serve_parser(sub)
    gen = sub.add_parser("generate", help="generate text for one prompt")
    add_engine_args(gen)
    add_sampling_args(gen)
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--raw", action="store_true", help="do not apply the chat template")
    gen.add_argument("--stream", action="store_true", help="print text as it is generated")
    gen.add_argument("--json", action="store_true", help="one JSON line per completion")
    gen.set_defaults(func=cmd_generate)

    comp = sub.add_parser("compile", help="compile a model folder into an artifact directory")
    add_model_args(comp)
    comp.add_argument("--out", required=True, help="artifact directory to write")
    comp.add_argument("--buckets", type=int, nargs="+", help="decode batch sizes to capture as CUDA graphs")
    comp.set_defaults(func=cmd_compile)

    insp = sub.add_parser("inspect", help="show what the compiler did to an artifact")
    insp.add_argument("artifact")
    insp.add_argument("--kernel", help="print this generated kernel's source")
    insp.add_argument("--dump", help="write graph code, depyf decompilations and kernel sources here")
    insp.set_defaults(func=cmd_inspect)

    bench = sub.add_parser("bench", help="benchmarks").add_subparsers(dest="bench", required=True)
    comp_bench = bench.add_parser("compile", help="cold compile, warm start, eager vs compiled vs CUDA graphs")
    comp_bench.add_argument("--preset", default="llama-3-8b")
    comp_bench.add_argument("--model", help="a model folder instead of a preset")
    comp_bench.add_argument("--work", default="bench-work", help="scratch directory (model, artifact, caches)")
    comp_bench.add_argument("--batch-sizes", type=lambda s: [int(x) for x in s.split(",")], default=[1])
    comp_bench.add_argument("--input-len", type=int, default=128)
    comp_bench.add_argument("--output-len", type=int, default=256)
    comp_bench.add_argument("--max-num-seqs", type=int, default=64)
    comp_bench.add_argument("--json", help="write the results here")
    comp_bench.set_defaults(func=cmd_bench_compile)
    serve_bench.add_parser(bench)
    latency.add_parser(bench)
    throughput.add_parser(bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, KeyError) as e:  # bad parameters, model folder or artifact: a message, not a traceback
        print(f"graphllm: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
