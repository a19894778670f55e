"""The `graphllm` command line: generate, serve, compile, inspect, bench.

The one place that reads the environment (environment.py) and turns flags into the config
objects passed down (args.py)."""

import argparse
import sys

from graphllm.bench import latency, serve_bench, spec_bench, throughput
from graphllm.cli.args import add_engine_args, add_model_args, add_sampling_args
from graphllm.cli.commands import cmd_bench_compile, cmd_compile, cmd_generate, cmd_inspect
from graphllm.cli.environment import Environment
from graphllm.cli.serve import add_serve_parser
from graphllm.config import CUDAGRAPH_MODES, DEFAULT_CUDAGRAPH_MODE, QUANTIZATIONS


def build_parser(env: Environment = Environment()) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="graphllm", description=__doc__.splitlines()[0])
    parser.set_defaults(cache_dir=env.cache_dir, torchrun=env.torchrun)
    sub = parser.add_subparsers(dest="command", required=True)
    add_serve_parser(sub, env)
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
    comp.add_argument("--enable-pdl", action=argparse.BooleanOptionalAction, default=True,
                      help="GPU (sm_90+): generate Inductor's kernels for programmatic dependent launch too, as "
                           "engines launch by default (CompileConfig.inductor_pdl; --no-enable-pdl: plain ones)")
    comp.set_defaults(func=cmd_compile)

    insp = sub.add_parser("inspect", help="show what the compiler did to an artifact")
    insp.add_argument("artifact")
    insp.add_argument("--kernel", help="print this generated kernel's source")
    insp.add_argument("--dump", help="write graph code, depyf decompilations and kernel sources here")
    insp.set_defaults(func=cmd_inspect)

    add_bench_parsers(sub.add_parser("bench", help="benchmarks").add_subparsers(dest="bench", required=True))
    return parser


def add_bench_parsers(bench) -> None:
    comp_bench = bench.add_parser("compile", help="cold compile, warm start, eager vs compiled vs CUDA graphs")
    comp_bench.add_argument("--preset", default="llama-3-8b")
    comp_bench.add_argument("--model", help="a model folder instead of a preset")
    comp_bench.add_argument("--work", default="bench-work", help="scratch directory (model, artifact, caches)")
    comp_bench.add_argument("--batch-sizes", type=lambda s: [int(x) for x in s.split(",")], default=[1])
    comp_bench.add_argument("--input-len", type=int, default=128)
    comp_bench.add_argument("--output-len", type=int, default=256)
    comp_bench.add_argument("--max-num-seqs", type=int, default=64)
    comp_bench.add_argument("--quantization", choices=QUANTIZATIONS, help="compile with this quantization scheme")
    comp_bench.add_argument("--no-decode", action="store_true", help="compile and start-up figures only")
    comp_bench.add_argument("--cudagraph-mode", default=DEFAULT_CUDAGRAPH_MODE, choices=CUDAGRAPH_MODES,
                            help="the warm starts' CUDA graphs (FULL: the mixed-step graphs too, their capture "
                                 "time and memory counted)")
    comp_bench.add_argument("--json", help="write the results here")
    comp_bench.set_defaults(func=cmd_bench_compile)
    serve_bench.add_parser(bench)
    latency.add_parser(bench)
    throughput.add_parser(bench)
    spec_bench.add_parser(bench)


def main(argv: list[str] | None = None) -> int:
    args = build_parser(Environment.read()).parse_args(argv)
    try:
        if args.torchrun is not None and args.torchrun.rank != 0 and args.command in ("generate", "serve"):
            from graphllm.cli.args import engine_config
            from graphllm.runtime.setup import run_worker_rank
            run_worker_rank(engine_config(args), args.torchrun.rank)  # rank 0 generates / serves
            return 0
        return args.func(args)
    except (ValueError, KeyError) as e:  # bad parameters, model folder or artifact: a message, not a traceback
        print(f"graphllm: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
