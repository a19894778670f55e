"""bench spec: the oracle proposer's acceptance, and the benchmark end to end on a tiny model (CPU)."""

import json

import pytest

from graphllm.cli.main import main
from graphllm.runtime.spec_decode.oracle import expected_acceptance, per_token_probability


@pytest.mark.parametrize("rate, k", [(1.0, 4), (0.6, 4), (0.6, 1), (0.3, 8), (0.0, 2)])
def test_the_oracle_hits_its_acceptance_rate_on_average(rate, k):
    p = per_token_probability(rate, k)
    assert expected_acceptance(p, k) == pytest.approx(rate, abs=1e-9)
    assert (p == 1.0) == (rate == 1.0)


def test_bench_spec_generates_the_plain_tokens_and_accepts_what_the_oracle_gets_right(tiny_model_dir, tmp_path):
    path, _ = tiny_model_dir("llama")
    out = tmp_path / "spec.json"
    code = main(["bench", "spec", "--model", str(path), "--eager", "--device", "cpu", "--work", str(tmp_path / "w"),
                 "--batch-sizes", "1,3", "--num-speculative-tokens", "1,3", "--acceptance-rates", "1.0,0.5",
                 "--input-len", "6", "--output-len", "24", "--json", str(out)])
    assert code == 0  # the benchmark itself fails when a speculative run's tokens differ from the plain run's
    rows = json.loads(out.read_text())["results"]
    assert [(r["batch_size"], r["k"], r["acceptance_target"]) for r in rows] == [
        (b, k, rate) for b in (1, 3) for k, rate in [(0, None), (1, 1.0), (1, 0.5), (3, 1.0), (3, 0.5)]]
    for r in rows:
        plain = next(p for p in rows if p["batch_size"] == r["batch_size"] and p["k"] == 0)
        if r["acceptance_target"] == 1.0:  # every proposal right: k + 1 tokens a step, all proposals accepted
            assert r["acceptance_rate"] == 1.0 and r["decode_steps"] < plain["decode_steps"]
            assert r["mean_accepted_length"] == pytest.approx(1 + r["k"], rel=0.25)
        elif r["acceptance_target"] == 0.5:
            assert 0.0 < r["acceptance_rate"] < 1.0


def test_bench_spec_ngram_on_the_demo_model_accepts_the_restated_question(tmp_path):
    """The demo model restates each question in its answer: prompt lookup proposes those tokens, and they are
    accepted (the tokens themselves equal the plain engine's: the benchmark checks it)."""
    out = tmp_path / "ngram.json"
    code = main(["bench", "spec", "--method", "ngram", "--eager", "--device", "cpu", "--work", str(tmp_path / "w"),
                 "--batch-sizes", "1,4", "--num-speculative-tokens", "2,4", "--output-len", "24", "--json", str(out)])
    assert code == 0
    rows = json.loads(out.read_text())["results"]
    assert [(r["batch_size"], r["k"]) for r in rows] == [(1, 0), (4, 0), (1, 2), (4, 2), (1, 4), (4, 4)]
    for r in rows[2:]:
        plain = rows[0] if r["batch_size"] == 1 else rows[1]
        assert r["acceptance_rate"] > 0.1 and r["mean_accepted_length"] > 1.1
        assert r["decode_steps"] < plain["decode_steps"]


def test_bench_spec_profiles_plain_and_verify_steps(tiny_model_dir, tmp_path, capsys):
    path, _ = tiny_model_dir("llama")
    out, prof = tmp_path / "spec.json", tmp_path / "prof"
    code = main(["bench", "spec", "--model", str(path), "--eager", "--device", "cpu", "--work", str(tmp_path / "w"),
                 "--batch-sizes", "1", "--num-speculative-tokens", "2", "--acceptance-rates", "1.0",
                 "--input-len", "6", "--output-len", "8", "--profile", str(prof), "--profile-steps", "3",
                 "--json", str(out)])
    assert code == 0
    report = json.loads(out.read_text())["profile"]
    assert (report["batch_size"], report["k"]) == (1, 2)
    plain, verify = report["plain"]["phases"]["decode"], report["verify"]["phases"]["decode"]
    assert plain["steps"] == 3 and plain["rows"]  # a decode step per token
    assert 1 <= verify["steps"] <= 3 and verify["rows"]  # k + 1 tokens a verify step: fewer steps for the tokens
    assert (prof / "plain" / "kernels.md").is_file() and (prof / "verify-k2" / "trace.json").is_file()
    capsys.readouterr()
    assert main(["bench", "spec", "--method", "ngram", "--eager", "--device", "cpu", "--work", str(tmp_path / "w"),
                 "--profile", str(prof)]) != 0
    assert "bench spec --profile profiles the oracle's verify steps" in capsys.readouterr().err
