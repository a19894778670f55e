"""Tensor parallelism across torchrun's processes (the many-node launch, here on one node): every process
is a rank, rank 0 generates, the others serve its steps; the text equals one process's. Real torchrun
(python -m torch.distributed.run), real gloo, eager and from a tensor-parallel artifact."""

import json
import subprocess
import sys

import pytest

from tests.passes.test_shard_tp import free_port

pytestmark = pytest.mark.slow  # starts torchrun and its processes

GENERATE = ["generate", "--prompt", "w5 w9 w17", "--raw", "--max-tokens", "8", "--ignore-eos", "--json"]


def graphllm(*args: str, torchrun: int = 0, timeout: int = 300) -> subprocess.CompletedProcess:
    launch = [sys.executable, "-m", "graphllm.cli"]
    if torchrun:
        launch = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(torchrun),
                  "--master-port", str(free_port()), "-m", "graphllm.cli"]
    return subprocess.run(launch + list(args), capture_output=True, text=True, timeout=timeout)


def tokens(done: subprocess.CompletedProcess) -> list[int]:
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, done.stdout  # rank 0 alone prints
    return lines[0]["token_ids"]


def test_eager_ranks_under_torchrun_generate_one_processes_text(tiny_model_dir):
    path = str(tiny_model_dir("llama")[0])
    want = tokens(graphllm(*GENERATE, "--model", path, "--eager"))
    assert tokens(graphllm(*GENERATE, "--model", path, "--eager", "-tp", "2", torchrun=2)) == want


def test_a_tensor_parallel_artifact_under_torchrun(tiny_model_dir, tmp_path):
    path = str(tiny_model_dir("mistral")[0])  # qwen2's tiny folder gets transformers' Qwen2 tokenizer class
    art = str(tmp_path / "art")
    done = graphllm("compile", "--model", path, "--out", art, "-tp", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    want = tokens(graphllm(*GENERATE, "--model", path, "--eager"))
    assert tokens(graphllm(*GENERATE, "--artifact", art, "-tp", "2", torchrun=2)) == want


def test_torchrun_asks_for_its_size_and_a_compiled_artifact(tiny_model_dir):
    path = str(tiny_model_dir("llama")[0])
    done = graphllm(*GENERATE, "--model", path, "--eager", torchrun=2)
    assert done.returncode != 0 and "torchrun started 2 processes; give --tensor-parallel-size 2" in done.stderr
    done = graphllm(*GENERATE, "--model", path, "-tp", "2", torchrun=2)
    assert done.returncode != 0 and "under torchrun, compile first" in done.stderr
