"""`graphllm generate` as a user runs it: a real subprocess."""

import json
import subprocess
import sys


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "graphllm.cli", *args], capture_output=True, text=True,
                          timeout=300)


def test_generate_prints_one_json_line_per_completion(tiny_model_dir):
    path, _ = tiny_model_dir("llama")
    result = run_cli("generate", "--model", str(path), "--eager", "--prompt", "w3 w4 w5", "--raw", "--max-tokens", "5",
                     "--ignore-eos", "--n", "2", "--temperature", "1", "--seed", "0", "--json")
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [line["index"] for line in lines] == [0, 1]
    assert all(len(line["token_ids"]) == 5 and line["finish_reason"] == "length" for line in lines)


def test_bad_model_folder_is_a_message_not_a_traceback(tmp_path):
    result = run_cli("generate", "--model", str(tmp_path), "--prompt", "hi")
    assert result.returncode == 2
    assert "no config.json" in result.stderr and "Traceback" not in result.stderr


def test_invalid_sampling_flag_is_a_message(tiny_model_dir):
    path, _ = tiny_model_dir("llama")
    result = run_cli("generate", "--model", str(path), "--eager", "--prompt", "w3", "--top-p", "1.5")
    assert result.returncode == 2 and "top_p" in result.stderr
