"""bench compile's start-up figures: page-cache eviction, disk bandwidth, and the printed phases."""

from graphllm.bench.compile_bench import disk_read_gb_s, evict, format_results


def test_evicting_keeps_the_bytes_and_the_disk_read_is_measured(tmp_path):
    (tmp_path / "weights.safetensors").write_bytes(bytes(range(256)) * 4096)
    (tmp_path / "graphs").mkdir()
    (tmp_path / "graphs" / "a.txt").write_text("x")
    assert evict(tmp_path)
    assert (tmp_path / "weights.safetensors").read_bytes() == bytes(range(256)) * 4096
    assert disk_read_gb_s(tmp_path / "weights.safetensors") > 0


def test_format_results_prints_each_start_up_phase():
    start = {"to_first_token_s": 5.25, "load_s": 4.5, "imports_s": 1.5, "load_call_to_first_token_s": 3.75,
             "graph_capture_s": 1.0, "graph_pool_gib": 0.125,
             "startup": {"verify": 0.1, "weights": 1.5, "step": 0.75, "tokenizer": 0.2, "kv_cache": 0.05,
                         "graphs": 1.0}}
    text = format_results({"cold_compile": {"wall_s": 40.0, "phases": {"load": 2.0, "lower": 20.0}},
                           "warm_start": start, "cold_disk_start": {**start, "to_first_token_s": 9.0},
                           "disk_read_gb_s": 2.5, "decode": []})
    assert "warm start to first token: 5.2 s from the process's start, 3.8 s from the Engine.load call" in text
    assert "(imports 1.5 s;" in text and "weights 1.50, step 0.75" in text
    assert "cold-disk start to first token: 9.0 s" in text and "2.50 GB/s" in text


def test_warm_start_script_loads_an_artifact_in_either_cudagraph_mode(compiled_dir):
    """The warm-start process itself, on an artifact (on CPU: no graphs, so no capture time or pool)."""
    import time
    from graphllm.bench.compile_bench import WARM_START, run_python
    for mode in ("FULL_DECODE_ONLY", "FULL"):
        r = run_python(WARM_START, compiled_dir("llama"), time.time(), 160, mode)
        assert r["to_first_token_s"] >= r["load_s"] > r["imports_s"] > 0 and "graphs" in r["startup"]
        assert abs(r["load_call_to_first_token_s"] + r["imports_s"] - r["to_first_token_s"]) < 1e-3
        assert r["graph_pool_gib"] is None and r["mixed_graph_capture_s"] is None
