"""`graphllm bench throughput` on the GPU: each step's span of the GPU timeline (StepTimer's CUDA events) is in the
step table, and the phase split of the wall time is taken from it (under async scheduling the host's step totals
hold the step before's GPU time)."""

import json

import pytest
import torch

from graphllm.cli.main import main

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_steps_carry_their_span_of_the_gpu_timeline(tiny_model_dir, tmp_path):
    model = tiny_model_dir("llama")[0]
    out = tmp_path / "throughput.json"
    assert main(["bench", "throughput", "--model", str(model), "--eager", "--device", "cuda", "--work",
                 str(tmp_path / "work"), "--num-requests", "12", "--min-len", "4", "--max-len", "40",
                 "--max-num-seqs", "4", "--gemm-tflops", "100", "--bandwidth-tbs", "1", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    ours = report["ours"]
    spans = ours["step_table"]["gpu_ms"]
    assert len(spans) == ours["steps"] and all(s >= 0 for s in spans)
    # the timeline from the first step's start to the last step's launches: within the wall time, and most of it
    assert 0.5 * ours["wall_s"] <= sum(spans) / 1e3 <= ours["wall_s"]
    split = ours["wall_split"]
    assert {p["source"] for p in split.values()} == {"gpu"}
    for phase, d in ours["step_breakdown_ms"].items():
        assert split[phase]["seconds"] == pytest.approx(d["steps"] * d["gpu_ms"] / 1e3)
    assert sum(p["steps"] for p in report["schedule_floor"]["phases"].values()) == ours["steps"]
