"""`graphllm compile` and `graphllm inspect` as a user runs them."""

import json
import os
import re
import subprocess
import sys

import pytest


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "graphllm.cli", *args], capture_output=True, text=True,
                          timeout=600)


@pytest.fixture(scope="module")
def cli_artifact(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "art"
    result = run_cli("compile", "--model", str(tiny_model_dir("qwen3")[0]), "--out", str(out),
                     "--max-num-seqs", "16", "--buckets", "1", "2", "4", "16")
    assert result.returncode == 0, result.stderr
    return out, result


def test_compile_reports_phases(cli_artifact):
    out, result = cli_artifact
    for phase in ("load", "capture", "passes", "lower", "write", "total"):
        assert phase in result.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["compile"]["buckets"] == [1, 2, 4, 16] and manifest["compile"]["max_num_seqs"] == 16
    assert manifest["compile_command"].startswith("graphllm compile --model")


def test_generate_that_compiles_prints_only_the_answer_on_stdout(tiny_model_dir, tmp_path):
    """The compile on the fly reports its progress and phase timings on stderr: stdout is the answer."""
    env = {**os.environ, "GRAPHLLM_CACHE_DIR": str(tmp_path / "cache")}  # empty: generate must compile
    args = ["generate", "--model", str(tiny_model_dir("qwen3")[0]), "--dtype", "float32", "--max-num-seqs", "4",
            "--max-num-batched-tokens", "64", "--prompt", "w3 w4 w5", "--raw", "--max-tokens", "3", "--ignore-eos",
            "--json"]
    result = subprocess.run([sys.executable, "-m", "graphllm.cli", *args], capture_output=True, text=True,
                            timeout=600, env=env)
    assert result.returncode == 0, result.stderr
    assert "phase timings:" in result.stderr  # it did compile
    assert "phase timings" not in result.stdout
    assert [len(json.loads(line)["token_ids"]) for line in result.stdout.splitlines()] == [3]


def test_inspect_lists_passes_and_kernels_with_sources(cli_artifact):
    out, _ = cli_artifact
    result = run_cli("inspect", str(out))
    assert result.returncode == 0, result.stderr
    assert "fuse_qkv" in result.stdout and "fused=2" in result.stdout
    assert "distinct generated kernels" in result.stdout and "cpp_fused_silu_and_mul" in result.stdout
    assert "source:  return self.o_proj(out.reshape(num_tokens, -1))" in result.stdout
    assert "modules: " in result.stdout and "model.model.layers.1.mlp.gate_up_proj" in result.stdout


def test_inspect_kernel_source(cli_artifact):
    out, _ = cli_artifact
    listing = run_cli("inspect", str(out)).stdout
    name = re.search(r"\bcpp_fused_\w+", listing).group(0)
    result = run_cli("inspect", str(out), "--kernel", name)
    assert result.returncode == 0 and name in result.stdout and "{" in result.stdout
    missing = run_cli("inspect", str(out), "--kernel", "no_such_kernel")
    assert missing.returncode == 2 and "no kernel named" in missing.stderr


def test_inspect_dump(cli_artifact, tmp_path):
    out, _ = cli_artifact
    result = run_cli("inspect", str(out), "--dump", str(tmp_path / "dump"))
    assert result.returncode == 0, result.stderr
    files = {p.relative_to(tmp_path / "dump").as_posix() for p in (tmp_path / "dump").rglob("*") if p.is_file()}
    assert {"graph_before.py", "graph_after.py", "decompiled/LlamaAttention.forward.py"} <= files
    assert any(f.startswith("inductor/") and f.endswith(".cpp") for f in files)
    assert "def forward" in (tmp_path / "dump" / "decompiled" / "LlamaAttention.forward.py").read_text()


def test_inspect_names_a_damaged_artifact_before_reporting(cli_artifact, tmp_path):
    """Regression (s35's fuzzing): inspect printed half its report, then a FileNotFoundError or BadZipFile traceback
    for a missing or truncated code file."""
    import shutil
    damaged = tmp_path / "art"
    shutil.copytree(cli_artifact[0], damaged)
    (damaged / "graphs" / "nodes.json").unlink()
    result = run_cli("inspect", str(damaged))
    assert result.returncode == 2 and result.stdout == "", result.stdout
    assert "graphllm: error:" in result.stderr and "missing graphs/nodes.json" in result.stderr, result.stderr


def test_compile_refuses_to_replace_a_folder_that_is_not_an_artifact(tiny_model_dir, tmp_path):
    """Regression (s35's fuzzing): `compile --out DIR` deleted DIR's files; `--out MODEL` deleted the model."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "thesis.txt").write_text("x")
    result = run_cli("compile", "--model", str(tiny_model_dir("qwen3")[0]), "--out", str(victim))
    assert result.returncode == 2 and "directory of other files" in result.stderr, result.stderr
    assert (victim / "thesis.txt").read_text() == "x"
