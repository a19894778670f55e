"""`graphllm generate`, `compile` and `inspect` (serve: serve.py; bench: graphllm/bench)."""

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from graphllm.cli.args import compile_config, engine_config, sampling_params
from graphllm.runtime.sampling_params import SamplingParams

if TYPE_CHECKING:  # not at run time: the runtime's sampler imports torch, which the CLI imports late
    from graphllm.runtime.outputs import CompletionOutput
    from graphllm.runtime.sampler import Logprob

MIN_LOGPROB = -9999.0  # as the OpenAI server clamps -inf


def cmd_generate(args: argparse.Namespace) -> int:
    from graphllm.runtime.engine import Engine
    params = sampling_params(args)
    engine = Engine(engine_config(args))
    use_chat = not args.raw and getattr(engine.tokenizer, "chat_template", None)
    prompt = engine.apply_chat_template([{"role": "user", "content": args.prompt}]) if use_chat else args.prompt
    if args.stream:
        return asyncio.run(stream_to_stdout(engine, prompt, params))
    for completion in engine.generate(prompt, params)[0].outputs:
        print(json.dumps(completion_json(completion, params)) if args.json else completion.text)
    return 0


def completion_json(c: "CompletionOutput", params: SamplingParams) -> dict:
    """One `generate --json` line. With --logprobs N it has per output token (EOS included) the
    token's logprob and the N most likely tokens, like the entries of an OpenAI chat response's
    `logprobs.content`, with token ids."""
    line = {"index": c.index, "text": c.text, "token_ids": list(c.token_ids), "finish_reason": c.finish_reason}
    if c.logprobs is not None:
        line["logprobs"] = [token_logprobs(token_id, entry, params.logprobs)
                            for token_id, entry in zip(c.token_ids, c.logprobs)]
    return line


def token_logprobs(token_id: int, entry: dict[int, "Logprob"], num_top: int) -> dict:
    """The sampled token's logprob and top_logprobs, the num_top most likely (entry: the sampler's
    sampled token plus its top-N)."""
    ranked = sorted(entry.items(), key=lambda kv: kv[1].rank)[:num_top]
    return dict(token_logprob(token_id, entry[token_id]), top_logprobs=[token_logprob(t, lp) for t, lp in ranked])


def token_logprob(token_id: int, lp: "Logprob") -> dict:
    return {"token": lp.decoded_token, "token_id": token_id, "logprob": max(lp.logprob, MIN_LOGPROB)}


async def stream_to_stdout(engine, prompt, params: SamplingParams) -> int:
    async for out in engine.stream(prompt, params):
        sys.stdout.write(out.outputs[0].delta_text)
        sys.stdout.flush()
    print()
    return 0


def cmd_compile(args: argparse.Namespace) -> int:
    from graphllm.compiler.pipeline import compile_model
    from graphllm.runtime.setup import resolve_model_path
    command = " ".join(["graphllm", *sys.argv[1:]])
    manifest = compile_model(resolve_model_path(args.model), args.out, compile_config(args), args.device,
                             command=command)
    print(f"artifact written to {args.out} (cache key {manifest['cache_key']})")
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from graphllm.compiler import inspection
    from graphllm.compiler.artifact import check_files, read_manifest, weight_files
    art = Path(args.artifact)
    manifest = read_manifest(art)
    # every file there with its size, the code's hashes (the weights' would take a minute): a damaged artifact is
    # named before half a report (s35's fuzzing); not the environment, as inspecting another GPU's artifact is fine
    check_files(art, manifest, deferred=weight_files(manifest))
    if args.kernel:
        print(inspection.kernel_source(art, args.kernel))
        return 0
    if args.dump:
        written = inspection.dump(art, Path(args.dump), manifest)
        print(f"wrote {len(written)} files under {args.dump}")
        return 0
    ranks = (manifest.get("tensor_parallel") or {}).get("size", 1)
    print(f"{art}: {manifest['model']['architecture']}, dtype {manifest['compile']['dtype']}, "
          f"buckets {manifest['compile']['buckets']}, compiled for {manifest['environment']['device_name']}"
          + (f", tensor parallel over {ranks} ranks (one step; weights.safetensors and weights.rankN.safetensors)"
             if ranks > 1 else "") + "\n")
    print(inspection.format_passes(manifest) + "\n")
    if manifest.get("quantization"):
        print(inspection.format_quantization(manifest) + "\n")
    print(inspection.format_kernels(inspection.kernels_with_sources(art)))
    return 0


def cmd_bench_compile(args: argparse.Namespace) -> int:
    from graphllm.bench.compile_bench import main as bench_main
    return bench_main(args)
