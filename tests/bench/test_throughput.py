"""`graphllm bench throughput` through the real CLI entry, on CPU: tiny model, eager, a few requests.

Token counts are checked on a model folder where every token is an EOS (see test_latency), so
only ignoring EOS gives each request its full output length.
"""

import json
from pathlib import Path

import pytest

from graphllm.bench.workload import make_requests
from graphllm.cli.main import main
from tests.bench.test_latency import PNG_MAGIC, every_token_eos
from tests.tiny_models import VOCAB

MIN_LEN, MAX_LEN, NUM = 3, 12, 7


def run_throughput(tmp_path: Path, model: Path, *extra: str) -> dict:
    out = tmp_path / "throughput.json"
    code = main(["bench", "throughput", "--model", str(model), "--eager", "--device", "cpu", "--work",
                 str(tmp_path / "work"), "--num-requests", str(NUM), "--min-len", str(MIN_LEN), "--max-len",
                 str(MAX_LEN), "--max-num-seqs", "4", "--seed", "3", "--json", str(out), *extra])
    assert code == 0
    return json.loads(out.read_text())


def test_lengths_are_seeded_uniform_within_bounds():
    a = make_requests(200, MIN_LEN, MAX_LEN, VOCAB, seed=0)
    assert a == make_requests(200, MIN_LEN, MAX_LEN, VOCAB, seed=0)
    assert a != make_requests(200, MIN_LEN, MAX_LEN, VOCAB, seed=1)
    inputs, outputs = [len(r.prompt) for r in a], [r.output_len for r in a]
    for lengths in (inputs, outputs):
        assert min(lengths) == MIN_LEN and max(lengths) == MAX_LEN  # 200 draws reach both ends of 10 values
    assert inputs != outputs  # drawn independently
    assert all(0 <= t < VOCAB for r in a for t in r.prompt)
    with pytest.raises(ValueError):
        make_requests(1, 5, 4, VOCAB, seed=0)


def test_every_request_gets_its_output_len_and_rates_add_up(tiny_model_dir, tmp_path):
    model = every_token_eos(tiny_model_dir("llama")[0], tmp_path / "eos-model")
    png = tmp_path / "throughput.png"
    report = run_throughput(tmp_path, model, "--plot", str(png), "--gemm-tflops", "0.5", "--bandwidth-tbs", "0.01")
    expected = make_requests(NUM, MIN_LEN, MAX_LEN, VOCAB, seed=3)
    assert report["requests"] == [{"input_len": len(r.prompt), "output_len": r.output_len} for r in expected]
    ours = report["ours"]
    assert ours["generated_tokens"] == [r.output_len for r in expected]
    assert ours["output_tokens"] == sum(r.output_len for r in expected)
    assert ours["input_tokens"] == sum(len(r.prompt) for r in expected)
    assert ours["output_tok_s"] == pytest.approx(ours["output_tokens"] / ours["wall_s"])
    assert ours["total_tok_s"] > ours["output_tok_s"] > 0 and ours["requests_s"] == pytest.approx(NUM / ours["wall_s"])
    assert ours["step_breakdown_ms"]["decode"]["steps"] > 0
    table = ours["step_table"]  # one entry per step; prompt tokens add up to the inputs (no preemption here)
    assert len(table["model_ms"]) == ours["steps"] and all(1 <= n <= 4 for n in table["seqs"])
    if ours["preemptions"] == 0:
        assert sum(table["prefill_tokens"]) == ours["input_tokens"]
    assert report["engine"]["max_num_seqs"] == 4
    assert report["engine"]["max_model_len"] == 48  # 2 * MAX_LEN + 16, in whole blocks of 16
    roof, split = report["roofline"], ours["wall_split"]  # the ceilings as given; the workload's floor
    assert report["ceilings"]["gemm_tflops"] == 0.5 and report["ceilings"]["bandwidth_tbs"] == 0.01
    assert roof["output_tokens"] == ours["output_tokens"] and roof["matmul_flop"] > roof["attention_flop"] > 0
    assert roof["floor_s"] == pytest.approx(roof["compute_s"] + roof["kv_s"])
    assert ours["roofline_share"] == pytest.approx(ours["output_tok_s"] / roof["output_tok_s"])
    steps = ours["step_breakdown_ms"]
    assert {p: s["steps"] for p, s in split.items()} == {p: s["steps"] for p, s in steps.items()}
    assert 0 < sum(s["seconds"] for s in split.values()) <= ours["wall_s"]
    # the schedule's floor: every step at least its weight read; no step is processed twice (no preemption)
    floor = report["schedule_floor"]
    assert floor["steps"] == ours["steps"] and floor["floor_s"] >= ours["steps"] * report["weights"][
        "decode_read_bytes"] / 0.01e12
    assert {p: f["steps"] for p, f in floor["phases"].items()} == {p: s["steps"] for p, s in steps.items()}
    assert sum(f["floor_s"] for f in floor["phases"].values()) == pytest.approx(floor["floor_s"])
    assert "gpu_ms" not in table and {s["source"] for s in split.values()} == {"host"}  # no CUDA events on a CPU
    assert sum(table["new_tokens"]) == ours["input_tokens"] + ours["output_tokens"] - NUM  # the last token never runs
    assert all(d <= n for d, n in zip(table["decode_seqs"], table["seqs"]))
    assert "transformers" not in report
    assert png.read_bytes()[:8] == PNG_MAGIC


def test_compare_transformers_on_the_first_requests(tiny_model_dir, tmp_path):
    model = every_token_eos(tiny_model_dir("llama")[0], tmp_path / "eos-model")
    png = tmp_path / "throughput.png"
    report = run_throughput(tmp_path, model, "--compare", "transformers", "--compare-num-requests", "5",
                            "--hf-batch-size", "2", "--plot", str(png))
    first = make_requests(NUM, MIN_LEN, MAX_LEN, VOCAB, seed=3)[:5]
    hf, ours = report["transformers"], report["ours_on_compared"]
    assert hf["num_requests"] == ours["num_requests"] == 5 and report["ours"]["num_requests"] == NUM
    assert hf["generated_tokens"] == ours["generated_tokens"] == [r.output_len for r in first]
    # each batch of 2 ran to its longest request
    assert hf["batch_generated_tokens"] == [max(r.output_len for r in first[i:i + 2]) for i in range(0, 5, 2)]
    assert report["ratio"]["output_tok_s"] == pytest.approx(ours["output_tok_s"] / hf["output_tok_s"])
    assert png.read_bytes()[:8] == PNG_MAGIC


def test_shared_prefix_workload_hits_the_cache_and_reports_first_token_times(tiny_model_dir, tmp_path):
    model = every_token_eos(tiny_model_dir("llama")[0], tmp_path / "eos-model")
    shared = ("--workload", "shared-prefix", "--num-prefixes", "2", "--prefix-len", "40", "--suffix-len", "5",
              "--output-len", "6")
    on = run_throughput(tmp_path / "on", model, *shared)["ours"]
    off = run_throughput(tmp_path / "off", model, *shared, "--no-enable-prefix-caching")["ours"]
    for run in (on, off):
        assert run["generated_tokens"] == [6] * NUM and run["input_tokens"] == NUM * 45
        assert 0 < run["ttft_s"]["median"] <= run["ttft_s"]["p90"] <= run["wall_s"]
    assert off["prefix_cache"] == {"enabled": False, "queried_tokens": 0, "hit_tokens": 0}
    assert on["prefix_cache"]["enabled"] and on["prefix_cache"]["queried_tokens"] == NUM * 45
    hit = on["prefix_cache"]["hit_tokens"]
    assert hit >= 32  # at least one request after the first found two full 16-token blocks of its prefix
    assert sum(on["step_table"]["prefill_tokens"]) == NUM * 45 - hit  # cached tokens are not computed
    assert sum(off["step_table"]["prefill_tokens"]) == NUM * 45


def test_structured_fraction_constrains_every_other_request(tmp_path):
    from graphllm.demo import DEMO_MODEL_DIR
    report = run_throughput(tmp_path, Path(DEMO_MODEL_DIR), "--structured-fraction", "0.5")
    ours = report["ours"]
    assert ours["structured_requests"] == (NUM + 1) // 2  # requests 0, 2, 4, 6
    assert 0 < ours["structured_output_tokens"] <= ours["output_tokens"]


def test_structured_fraction_on_a_model_without_a_tokenizer(tiny_model_dir, tmp_path):
    """Not the every-token-EOS folder: its grammars admit no output (no token that is not a stop token), which
    compiling refuses."""
    import shutil
    model = Path(shutil.copytree(tiny_model_dir("llama")[0], tmp_path / "no-tokenizer"))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (model / name).unlink(missing_ok=True)
    ours = run_throughput(tmp_path, model, "--structured-fraction", "0.5")["ours"]
    assert ours["structured_requests"] == (NUM + 1) // 2 and ours["structured_output_tokens"] > 0


def test_the_synthetic_vocabulary_is_distinct_and_seeded():
    from graphllm.bench.workload import synthetic_vocabulary
    vocab = synthetic_vocabulary(5000)
    assert len(set(vocab)) == 5000 and vocab == synthetic_vocabulary(5000) and "{" in vocab and '"' in vocab
