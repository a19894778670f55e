"""`graphllm serve` flags -> configs, and the real command serving the demo model."""

import argparse
import os
import subprocess
import sys
import time

import httpx2 as httpx
import pytest

from graphllm.cli.args import compile_config, engine_config
from graphllm.cli.main import build_parser
from graphllm.config import DEFAULT_LIMITS
from graphllm.cli.serve import DEMO_MODEL_NAME, add_serve_parser, server_config
from tests.server.conftest import free_port, model_dir  # noqa: F401  (model_dir: a fixture)


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["serve", *argv])


def test_defaults_serve_the_demo_model_on_localhost():
    args = parse()
    assert (args.host, args.port) == ("127.0.0.1", 8000)
    config = server_config(args)
    assert config.served_model_names == (DEMO_MODEL_NAME,) and config.tool_call_parser == "hermes"
    assert engine_config(args).model is None and engine_config(args).compile


def test_flags_reach_the_configs():
    args = parse("--model", "/m", "--api-key", "k", "--served-model-name", "a", "b", "--max-model-len", "64",
                 "--max-num-seqs", "4", "--dtype", "float32", "--reasoning-parser", "qwen3", "--eager",
                 "--tool-call-parser", "llama3_json", "--enable-auto-tool-choice")
    config, engine = server_config(args), engine_config(args)
    assert config.served_model_names == ("a", "b") and config.api_key == "k"
    assert (config.tool_call_parser, config.reasoning_parser) == ("llama3_json", "qwen3")
    assert (engine.model, engine.max_model_len, engine.max_num_seqs, engine.dtype, engine.compile) == \
        ("/m", 64, 4, "float32", False)
    assert server_config(parse("--model", "/m")).tool_call_parser is None  # only the demo defaults to hermes
    assert engine_config(parse("--chat-template", "t.jinja")).chat_template == "t.jinja"
    config = server_config(parse("--generation-config", "vllm", "--override-generation-config", '{"top_p": 0.5}',
                                 "--max-logprobs", "5", "--allowed-origins", '["https://a.example"]',
                                 "--trust-remote-code", "--disable-log-requests"))
    assert (config.generation_config, config.override_generation_config, config.max_logprobs,
            config.allowed_origins) == ("vllm", {"top_p": 0.5}, 5, ("https://a.example",))
    assert engine_config(parse()).chat_template is None


def test_memory_and_block_flags_reach_the_engine_and_the_compiler():
    """vLLM's sizing flags: --gpu-memory-utilization, --num-gpu-blocks-override, --kv-cache-memory-gib (was bench-only)
    and --block-size, which the artifact-mismatch error already told users to pass and no command took."""
    args = parse("--gpu-memory-utilization", "0.95", "--kv-cache-memory-gib", "12.5", "--num-gpu-blocks-override",
                 "300", "--block-size", "32")
    engine = engine_config(args)
    assert (engine.gpu_memory_utilization, engine.kv_cache_memory_gib, engine.num_kv_blocks, engine.block_size) == \
        (0.95, 12.5, 300, 32)
    assert engine.compile_config().block_size == 32  # serve / generate compiling a model folder
    compile_args = ["compile", "--model", "/m", "--out", "/a"]
    assert compile_config(build_parser().parse_args([*compile_args, "--block-size", "32"])).block_size == 32
    assert compile_config(build_parser().parse_args(compile_args)).block_size == DEFAULT_LIMITS["block_size"]
    defaults = engine_config(parse())
    assert (defaults.gpu_memory_utilization, defaults.kv_cache_memory_gib, defaults.num_kv_blocks,
            defaults.block_size) == (0.9, None, None, None)
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        engine_config(parse("--gpu-memory-utilization", "1.2"))


def test_conflicting_model_flags_and_bad_ports_are_refused_before_loading():
    """Regression (s35's fuzzing): --model with --artifact ran the artifact (serve announced the model folder),
    --eager with --artifact ran compiled code, and --port 99999 failed in bind() after the model had loaded."""
    with pytest.raises(ValueError, match="not both"):
        engine_config(parse("--model", "/m", "--artifact", "/a"))
    with pytest.raises(ValueError, match="--eager"):
        engine_config(parse("--artifact", "/a", "--eager"))
    assert parse("--trust-request-chat-template").trust_request_chat_template
    assert server_config(parse("--trust-request-chat-template")).trust_request_chat_template
    for port in ("99999", "0", "-1", "http"):
        with pytest.raises(SystemExit):
            parse("--port", port)
    assert parse("--port", "65535").port == 65535


def test_unknown_parser_names_are_refused():
    with pytest.raises(ValueError, match="tool_call_parser"):
        server_config(parse("--tool-call-parser", "nope"))
    with pytest.raises(ValueError, match="reasoning_parser"):
        server_config(parse("--reasoning-parser", "nope"))


def test_serve_command_answers_then_stops(model_dir):
    port = free_port()
    argv = [sys.executable, "-m", "graphllm.cli", "serve", "--eager", "--port", str(port), "--log-level", "warning"]
    argv += ["--model", model_dir] if model_dir else []
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "GRAPHLLM_API_KEY": "k"})
    try:
        base, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 90
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "server did not come up"
            time.sleep(0.2)
        assert httpx.get(base + "/v1/models", timeout=5).status_code == 401  # the key from the environment
        models = httpx.get(base + "/v1/models", headers={"Authorization": "Bearer k"}, timeout=5).json()
        assert len(models["data"]) == 1
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_sigterm_drains_running_streams_then_exits_0(model_dir):  # noqa: F811  (model_dir: a fixture)
    """SIGTERM: the stream already running finishes, new requests are refused, the process exits 0."""
    import signal

    import openai
    port = free_port()
    argv = [sys.executable, "-m", "graphllm.cli", "serve", "--eager", "--port", str(port), "--log-level", "warning",
            "--shutdown-timeout", "20"] + (["--model", model_dir] if model_dir else [])
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        base, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 90
        while not _healthy(base):
            assert proc.poll() is None and time.monotonic() < deadline, "server did not come up"
            time.sleep(0.2)
        client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=60)
        stream = client.completions.create(model="graphllm-demo", prompt=[1, 2, 3], max_tokens=200, stream=True,
                                           extra_body={"ignore_eos": True})
        chunks = [next(iter(stream))]
        proc.send_signal(signal.SIGTERM)
        chunks += list(stream)  # the running stream is not cut off
        assert chunks[-1].choices[0].finish_reason == "length"
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def _healthy(base: str) -> bool:
    try:
        return httpx.get(base + "/health", timeout=1).status_code == 200
    except httpx.TransportError:
        return False
