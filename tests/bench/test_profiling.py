"""`--profile DIR` on CPU (CPU ops, self time) and the matmul byte counts behind its GB/s column."""

import json

import pytest
import torch

from graphllm.bench.profiling import matmul_bytes
from graphllm.cli.main import main


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


def test_graph_kernels_get_the_bytes_of_the_same_kernel_in_a_plain_step():
    from graphllm.bench.profiling import graph_kernel_bytes
    row = lambda calls, us, nbytes, bytes_us: dict(calls=calls, us=us, bytes=nbytes, bytes_us=bytes_us)  # noqa: E731
    graph = {"gemv_128x8": row(96, 1800.0, 0, 0.0), "rms_norm": row(64, 150.0, 0, 0.0)}
    plain = {"gemv_128x8": row(32, 610.0, 32 * 235e6, 610.0), "rms_norm": row(64, 160.0, 0, 0.0)}
    graph_kernel_bytes(graph, plain)
    assert graph["gemv_128x8"]["bytes"] == 96 * 235e6 and graph["gemv_128x8"]["bytes_us"] == 1800.0
    assert graph["rms_norm"]["bytes_us"] == 0.0  # no matmul above it anywhere: no bandwidth


def test_matmul_bytes_without_recorded_dtypes_use_the_model_dtype():
    from types import SimpleNamespace
    from graphllm.bench import profiling
    event = SimpleNamespace(input_shapes=[[1, 4096], [4096, 6144]])  # torch 2.11: no input_dtypes
    assert profiling.matmul_bytes("aten::mm", event.input_shapes, profiling.input_dtypes(event, "c10::BFloat16")) == \
        2 * (4096 + 4096 * 6144 + 6144)


def test_the_pdl_note_only_where_kernels_launch_as_dependents():
    """PDL's overlapping kernel times are flagged on sm_90+ CUDA engines with enable_pdl; a CPU engine, or PDL
    off, gets no note (the kernels' times there add up to the step)."""
    from types import SimpleNamespace

    from graphllm.bench.profiling import PDL_NOTE, pdl_in_use
    cpu = SimpleNamespace(state=SimpleNamespace(device=torch.device("cpu")), config=SimpleNamespace(enable_pdl=True))
    assert not pdl_in_use(cpu)
    off = SimpleNamespace(state=SimpleNamespace(device=torch.device("cuda")), config=SimpleNamespace(enable_pdl=False))
    assert not pdl_in_use(off)  # decided before the device is asked for its capability
    assert "--no-enable-pdl" in PDL_NOTE


def test_own_times_leave_a_dependents_wait_out():
    """A programmatic dependent begun while the kernel before it runs gets only its time after that kernel ends;
    kernels back to back keep their whole time; a copy beside them keeps its own and covers nothing."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    from graphllm.bench.profiling import device_rows, own_times

    def kernel(name, start, end):
        return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start, end=end), device_type=DeviceType.CUDA,
                               is_user_annotation=False, kernels=[])

    attention, quant = kernel("attention", 0.0, 156.0), kernel("quant", 119.0, 160.0)  # s32's fp8 decode layer
    gemm, copy, after = kernel("gemm", 160.5, 177.0), kernel("Memcpy HtoD", 150.0, 170.0), kernel("norm", 177.0, 183.0)
    kernels = [attention, quant, copy, gemm, after]
    assert own_times(kernels) == [156.0, 4.0, 20.0, 16.5, 6.0]
    rows = device_rows([after, gemm, copy, quant, attention], [(0.0, 200.0, "decode")], "")["decode"]
    assert rows["quant"]["us"] == 41.0 and rows["quant"]["own_us"] == 4.0 and rows["gemm"]["own_us"] == 16.5
