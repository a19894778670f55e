"""`graphllm generate` as a user runs it: a real subprocess."""

import json
import math
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


def test_generate_json_carries_the_logprobs_it_was_asked_for(tiny_model_dir):
    """--logprobs N --json once printed no logprobs: each line now has, per output token, its logprob
    and the N most likely tokens, each with its decoded text."""
    path, _ = tiny_model_dir("llama")
    result = run_cli("generate", "--model", str(path), "--eager", "--prompt", "w3 w4 w5", "--raw", "--max-tokens", "4",
                     "--ignore-eos", "--temperature", "0", "--logprobs", "3", "--json")
    assert result.returncode == 0, result.stderr
    line = json.loads(result.stdout)
    assert [entry["token_id"] for entry in line["logprobs"]] == line["token_ids"]
    for entry in line["logprobs"]:
        top = entry["top_logprobs"]
        assert len(top) == 3 and all(isinstance(alt["token"], str) for alt in [entry, *top])
        assert [alt["logprob"] for alt in top] == sorted((alt["logprob"] for alt in top), reverse=True)
        assert top[0] == {k: entry[k] for k in ("token", "token_id", "logprob")}  # greedy: the most likely
        assert sum(math.exp(alt["logprob"]) for alt in top) <= 1 + 1e-5
    plain = run_cli("generate", "--model", str(path), "--eager", "--prompt", "w3", "--raw", "--max-tokens", "2", "--json")
    assert "logprobs" not in json.loads(plain.stdout)


def test_bad_model_folder_is_a_message_not_a_traceback(tmp_path):
    result = run_cli("generate", "--model", str(tmp_path), "--prompt", "hi")
    assert result.returncode == 2
    assert "no config.json" in result.stderr and "Traceback" not in result.stderr


def test_invalid_sampling_flag_is_a_message(tiny_model_dir):
    path, _ = tiny_model_dir("llama")
    result = run_cli("generate", "--model", str(path), "--eager", "--prompt", "w3", "--top-p", "1.5")
    assert result.returncode == 2 and "top_p" in result.stderr


def test_block_size_and_block_count_flags_size_the_cache_and_keep_the_tokens(tiny_model_dir):
    """--block-size and --num-gpu-blocks-override (vLLM's flags) reach the engine: 4-token blocks, 64 of them (the
    tiny model's 256 positions), generate the greedy tokens of the default cache; too few blocks for max_model_len
    is a message naming it."""
    path, _ = tiny_model_dir("llama")
    base = ("generate", "--model", str(path), "--eager", "--prompt", "w3 w4 w5 w6 w7", "--raw", "--max-tokens", "12",
            "--ignore-eos", "--json")
    default, small = run_cli(*base), run_cli(*base, "--block-size", "4", "--num-gpu-blocks-override", "64")
    assert default.returncode == 0 and small.returncode == 0, default.stderr + small.stderr
    assert json.loads(small.stdout)["token_ids"] == json.loads(default.stdout)["token_ids"]
    short = run_cli(*base, "--block-size", "4", "--num-gpu-blocks-override", "8")
    assert short.returncode == 2 and "holds 32 tokens, fewer than max_model_len=256" in short.stderr
    assert "Traceback" not in short.stderr
