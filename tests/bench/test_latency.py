"""`graphllm bench latency` through the real CLI entry, on CPU: tiny model, eager, small batches.

The model folder used for token counts makes every token an EOS, so a request that did not
ignore EOS would stop after its first token (for the engine and for transformers alike).
"""

import json
import shutil
from pathlib import Path

import pytest

from graphllm.bench.roofline import decode_weight_bytes
from graphllm.cli.main import main
from tests.tiny_models import VOCAB

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
INPUT_LEN, OUTPUT_LEN = 6, 5


def every_token_eos(folder: Path, dest: Path) -> Path:
    """A copy of `folder` whose config and generation config call every token id an EOS."""
    shutil.copytree(folder, dest)
    for name in ("config.json", "generation_config.json"):
        config = json.loads((dest / name).read_text())
        config["eos_token_id"] = list(range(VOCAB))
        (dest / name).write_text(json.dumps(config))
    return dest


def run_latency(tmp_path: Path, model: Path, *extra: str) -> dict:
    out = tmp_path / "latency.json"
    code = main(["bench", "latency", "--model", str(model), "--eager", "--device", "cpu", "--work",
                 str(tmp_path / "work"), "--batch-sizes", "1,3", "--input-len", str(INPUT_LEN), "--output-len",
                 str(OUTPUT_LEN), "--json", str(out), *extra])
    assert code == 0
    return json.loads(out.read_text())


def test_one_entry_per_batch_size_every_sequence_gets_exactly_output_len(tiny_model_dir, tmp_path):
    model = every_token_eos(tiny_model_dir("llama")[0], tmp_path / "eos-model")
    png = tmp_path / "latency.png"
    report = run_latency(tmp_path, model, "--plot", str(png), "--bandwidth-tbs", "0.5")
    assert [r["batch_size"] for r in report["results"]] == [1, 3]
    for r in report["results"]:
        assert r["generated_tokens"] == [OUTPUT_LEN] * r["batch_size"]
        assert r["prefill_s"] > 0 and r["decode_s"] > 0 and r["decode_tok_s_per_seq"] > 0
        assert r["decode_tok_s_per_seq"] == pytest.approx((OUTPUT_LEN - 1) / r["decode_s"])
        assert r["decode_tok_s"] == pytest.approx(r["batch_size"] * r["decode_tok_s_per_seq"])
        steps = r["step_breakdown_ms"]
        assert steps["prefill"]["steps"] == 1 and steps["decode"]["steps"] == OUTPUT_LEN - 1
        parts = sum(steps["decode"][f"{p}_ms"] for p in ("schedule", "model", "sample", "rest"))
        assert parts == pytest.approx(steps["decode"]["total_ms"]) and steps["decode"]["model_ms"] > 0
        assert 0 < steps["decode"]["p50_ms"] <= steps["decode"]["p99_ms"]
        assert r["ceiling_share"] == pytest.approx(r["decode_tok_s_per_seq"] / report["ceiling"]["tok_s_per_seq"])
    assert report["ceiling"]["tok_s_per_seq"] == pytest.approx(0.5e12 / report["weights"]["decode_read_bytes"])
    assert report["engine"]["max_num_seqs"] >= 3 and report["engine"]["max_num_batched_tokens"] >= 3 * INPUT_LEN
    assert png.read_bytes()[:8] == PNG_MAGIC


def test_compare_transformers_generates_the_same_tokens_count_and_gives_ratios(tiny_model_dir, tmp_path):
    model = every_token_eos(tiny_model_dir("llama")[0], tmp_path / "eos-model")
    png = tmp_path / "latency.png"
    report = run_latency(tmp_path, model, "--compare", "transformers", "--plot", str(png))
    for r in report["results"]:
        hf = r["transformers"]
        assert hf["generated_tokens"] == [OUTPUT_LEN] * r["batch_size"]
        assert hf["decode_tok_s"] > 0 and hf["prefill_s"] > 0
        assert r["ratio"]["decode_tok_s"] == pytest.approx(r["decode_tok_s"] / hf["decode_tok_s"])
    assert report["ceiling"]["tok_s_per_seq"] is None  # CPU: no bandwidth measured, none given
    assert png.read_bytes()[:8] == PNG_MAGIC


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_decode_weight_bytes_leave_out_untied_input_embeddings(tiny_model_dir, arch):
    import torch
    path, hf = tiny_model_dir(arch)
    params = {name: p.numel() for name, p in hf.named_parameters(remove_duplicate=False)}
    embed = params["model.embed_tokens.weight"]
    tied = hf.config.tie_word_embeddings
    total = sum(params.values()) - (embed if tied else 0)  # a tied lm_head is the embedding, stored once
    counted = decode_weight_bytes(path, torch.bfloat16)
    assert counted["tied_embeddings"] == tied and counted["parameters"] == total
    assert counted["decode_read_bytes"] == 2 * (total if tied else total - embed)


def test_batch_larger_than_max_num_seqs_is_an_error(tiny_model_dir, tmp_path, capsys):
    path, _ = tiny_model_dir("llama")
    code = main(["bench", "latency", "--model", str(path), "--eager", "--device", "cpu", "--work", str(tmp_path),
                 "--batch-sizes", "1,4", "--max-num-seqs", "2"])
    assert code == 2 and "--max-num-seqs" in capsys.readouterr().err


@pytest.mark.parametrize("arch, experts_field", [("mixtral", "num_local_experts"), ("qwen3_moe", "num_experts"),
                                                  ("deepseek_v2", "n_routed_experts")])
def test_a_moe_token_reads_only_the_experts_it_routes_to(tiny_model_dir, arch, experts_field):
    import torch
    path, hf = tiny_model_dir(arch)
    params = {name: p.numel() for name, p in hf.named_parameters()}
    experts = sum(n for name, n in params.items() if ".experts." in name)  # DeepSeek's shared_experts: read whole
    assert experts and (arch != "deepseek_v2" or any(".shared_experts." in name for name in params))
    dense = sum(params.values()) - experts - params["model.embed_tokens.weight"]
    routed = hf.config.num_experts_per_tok / getattr(hf.config, experts_field)
    counted = decode_weight_bytes(path, torch.bfloat16)
    assert counted["routed_expert_share"] == routed < 1
    assert counted["decode_read_bytes"] == round(2 * (dense + experts * routed))


def test_percentile_is_the_nearest_rank():
    from graphllm.bench.workload import percentile
    ordered = [float(i) for i in range(1, 101)]
    assert percentile(ordered, 50) == 50.0 and percentile(ordered, 99) == 99.0 and percentile(ordered, 100) == 100.0
    assert percentile([3.0], 99) == 3.0 and percentile([1.0, 9.0], 50) == 1.0


def test_speculative_config_reaches_the_engine(tiny_model_dir, tmp_path):
    model = every_token_eos(tiny_model_dir("llama")[0], tmp_path / "eos-model")
    report = run_latency(tmp_path, model, "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2}')
    for r in report["results"]:
        assert r["generated_tokens"] == [OUTPUT_LEN] * r["batch_size"]
    assert report["engine"]["spec_decode"] is not None and not report["engine"]["async_scheduling"]
