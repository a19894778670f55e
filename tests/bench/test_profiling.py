"""`--profile DIR` on CPU (CPU ops, self time) and the matmul byte counts behind its GB/s column."""

import json

import pytest

from graphllm.bench.profiling import matmul_bytes
from graphllm.cli import main


def test_latency_profile_writes_a_trace_and_an_op_table(tiny_model_dir, tmp_path, capsys):
    path, _ = tiny_model_dir("llama")
    prof, out = tmp_path / "prof", tmp_path / "latency.json"
    code = main(["bench", "latency", "--model", str(path), "--eager", "--device", "cpu", "--work", str(tmp_path / "w"),
                 "--batch-sizes", "2", "--input-len", "5", "--output-len", "3", "--profile", str(prof),
                 "--profile-steps", "3", "--json", str(out)])
    assert code == 0
    trace = json.loads((prof / "trace.json").read_text())
    assert any(e.get("name") == "graphllm.bench::decode" for e in trace["traceEvents"])
    phases = json.loads(out.read_text())["profile"]["phases"]
    assert phases["prefill"]["steps"] == 1 and phases["decode"]["steps"] == 3
    rows = {r["name"]: r for r in phases["decode"]["rows"]}
    assert rows["aten::mm"]["calls"] > 0 and rows["aten::mm"]["time_ms"] > 0
    assert rows["aten::mm"]["gb_s"] > 0  # a leaf matmul gets its bytes
    assert rows["aten::linear"]["gb_s"] is None  # its aten::mm below already counted them
    assert sum(r["share"] for r in phases["decode"]["rows"]) <= 1.0  # self times within the steps
    table = (prof / "kernels.md").read_text()
    assert "| aten::mm |" in table and "## decode: 3 steps" in table
    assert "aten::mm" in capsys.readouterr().out


@pytest.mark.parametrize("name, shapes, dtypes, expected", [
    ("aten::mm", [[8, 64], [64, 128]], ["float", "float"], 4 * (8 * 64 + 64 * 128 + 8 * 128)),
    ("aten::mm", [[8, 64], [64, 128], [8, 128]], ["c10::BFloat16"] * 3, 2 * (8 * 64 + 64 * 128 + 8 * 128)),  # out=
    ("aten::addmm", [[128], [8, 64], [64, 128], [], []], ["float"] * 3 + ["Scalar"] * 2,
     4 * (128 + 8 * 64 + 64 * 128 + 8 * 128)),
    ("aten::linear", [[2, 8, 64], [128, 64], []], ["c10::Half", "c10::Half", ""], 2 * (16 * 64 + 128 * 64 + 16 * 128)),
    ("aten::bmm", [[2, 3, 4], [2, 4, 5]], ["float", "float"], 4 * (24 + 40 + 30)),
    ("aten::add", [[8], [8]], ["float", "float"], None),  # not a matmul: no bytes claimed
    ("aten::addmm", [[8, 64], [64, 128]], ["float", "float"], None),  # shapes missing: unknown
])
def test_matmul_bytes_are_operands_plus_output(name, shapes, dtypes, expected):
    assert matmul_bytes(name, shapes, dtypes) == expected
