"""Tensor parallelism on one node, CPU and gloo: an engine with tensor_parallel_size N starts N-1 worker
processes, each running its shard of the captured step, and generates transformers' greedy tokens
(so the same as N = 1), including GQA with fewer KV heads than ranks and a tied embedding with q/k/v
bias; stopping it leaves no worker process behind."""

import pytest
import torch

from graphllm import Engine, SamplingParams

pytestmark = pytest.mark.slow  # starts worker processes

PROMPTS = [[1, 5, 9, 17, 33, 65, 100], [1, 42], [1] + list(range(10, 40))]
GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)


def transformers_tokens(hf) -> list[list[int]]:
    outs = []
    for prompt in PROMPTS:
        with torch.no_grad():
            out = hf.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False, eos_token_id=None,
                              pad_token_id=0)
        outs.append(out[0, len(prompt):].tolist())
    return outs


# tiny configs: 4 query heads, 2 KV heads; qwen2 ties its embedding and has q/k/v bias
@pytest.mark.parametrize("arch, world_size", [("llama", 2), ("qwen2", 2), ("llama", 4)])
def test_greedy_tokens_equal_transformers(arch, world_size, tiny_model_dir):
    path, hf = tiny_model_dir(arch)
    engine = Engine.from_pretrained(path, tensor_parallel_size=world_size)
    step = engine.runner.step
    try:
        assert len(step.workers) == world_size - 1 and all(p.is_alive() for p in step.workers)
        assert engine.runner.kv_caches[0].shape[3] == max(2 // world_size, 1)  # this rank's KV heads
        outs = engine.generate(PROMPTS, GREEDY)
        assert [o.outputs[0].token_ids for o in outs] == transformers_tokens(hf)
    finally:
        step.stop()
    assert not any(p.is_alive() for p in step.workers) and all(p.exitcode == 0 for p in step.workers)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_compiled_greedy_tokens_equal_transformers(arch, tiny_model_dir, tmp_path):
    """compile=True at N = 2: one compiled step, each rank with its own weights file (half the vocabulary
    rows of lm_head each), gives transformers' greedy tokens."""
    from safetensors import safe_open
    path, hf = tiny_model_dir(arch)
    engine = Engine.from_pretrained(path, tensor_parallel_size=2, compile=True, cache_dir=str(tmp_path))
    step = engine.runner.step
    try:
        art = next(p for p in (tmp_path / "artifacts").iterdir() if p.is_dir())  # not KEY.lock beside it
        assert sorted(p.name for p in art.glob("weights*")) == ["weights.rank1.safetensors", "weights.safetensors"]
        for name in ("weights.safetensors", "weights.rank1.safetensors"):
            with safe_open(art / name, "pt") as f:
                head = "model.lm_head.weight" if "model.lm_head.weight" in f.keys() else "model.model.embed_tokens.weight"
                assert f.get_slice(head).get_shape()[0] == hf.config.vocab_size // 2
        outs = engine.generate(PROMPTS, GREEDY)
        assert [o.outputs[0].token_ids for o in outs] == transformers_tokens(hf)
    finally:
        step.stop()
    assert all(p.exitcode == 0 for p in step.workers)


def test_compiled_moe_at_tp2_splits_its_experts_and_gives_transformers_tokens(tiny_model_dir, tmp_path):
    """Mixtral at N = 2, compiled: each rank holds half of every expert's intermediate rows (shard_tp), and the
    ranks' partial expert sums are all-reduced."""
    from safetensors import safe_open
    path, hf = tiny_model_dir("mixtral")
    engine = Engine.from_pretrained(path, tensor_parallel_size=2, compile=True, cache_dir=str(tmp_path))
    step = engine.runner.step
    try:
        art = next(p for p in (tmp_path / "artifacts").iterdir() if p.is_dir())  # not KEY.lock beside it
        with safe_open(art / "weights.rank1.safetensors", "pt") as f:
            w2 = next(n for n in f.keys() if n.endswith("experts.down_proj"))
            assert f.get_slice(w2).get_shape()[2] == hf.config.intermediate_size // 2
        outs = engine.generate(PROMPTS, GREEDY)
        assert [o.outputs[0].token_ids for o in outs] == transformers_tokens(hf)
    finally:
        step.stop()
    assert all(p.exitcode == 0 for p in step.workers)


def test_quantized_int4_at_tp2_generates_tp1s_tokens(tiny_model_dir, tmp_path):
    """Quantization runs after shard_tp, on each rank's slices: int4 groups of 32 fall on the shard
    boundaries here (K = 64 and 128 split in two), so rank weights quantize exactly as the whole ones."""
    path, _ = tiny_model_dir("llama")
    common = dict(compile=True, quantization="int4", quantization_group_size=32, cache_dir=str(tmp_path))
    one = Engine.from_pretrained(path, **common)
    want = [o.outputs[0].token_ids for o in one.generate(PROMPTS, GREEDY)]
    with Engine.from_pretrained(path, tensor_parallel_size=2, **common) as two:
        assert [o.outputs[0].token_ids for o in two.generate(PROMPTS, GREEDY)] == want
        workers = two.runner.step.workers
    assert not any(p.is_alive() for p in workers)  # the block's end shut the engine down


def test_shutdown_stops_the_workers_aborts_the_requests_and_refuses_more(tiny_model_dir):
    path, _ = tiny_model_dir("llama")
    engine = Engine.from_pretrained(path, tensor_parallel_size=2)
    workers = engine.runner.step.workers
    engine.add_request(PROMPTS[0], GREEDY)
    engine.shutdown()
    assert not engine.has_unfinished_requests() and not engine.requests
    assert not any(p.is_alive() for p in workers) and all(p.exitcode == 0 for p in workers)
    with pytest.raises(RuntimeError, match="shut down"):
        engine.generate(PROMPTS[:1], GREEDY)
    engine.shutdown()  # again: nothing
    with Engine.from_pretrained(path, tensor_parallel_size=2) as again:  # the process may start another
        assert again.generate(PROMPTS[:1], GREEDY)[0].outputs[0].token_ids


def test_a_tensor_parallel_artifact_runs_at_its_size(tiny_model_dir, tmp_path, capsys):
    from graphllm.cli.main import main
    from graphllm.compiler.pipeline import compile_model
    from graphllm.config import CompileConfig
    path, hf = tiny_model_dir("llama")
    art = tmp_path / "art"
    compile_model(path, art, CompileConfig(dtype="float32", tensor_parallel_size=2), "cpu", show_progress=False)
    assert main(["inspect", str(art)]) == 0
    shown = capsys.readouterr().out
    assert "tensor parallel over 2 ranks" in shown and "shard_tp" in shown and "vocab=2" in shown
    with pytest.raises(ValueError, match="compiled for tensor_parallel_size 2; it cannot run at 4"):
        Engine.load(art, tensor_parallel_size=4)
    engine = Engine.load(art)  # the artifact's size: 2 ranks
    try:
        assert len(engine.runner.step.workers) == 1
        outs = engine.generate(PROMPTS[:1], GREEDY)
        assert outs[0].outputs[0].token_ids == transformers_tokens(hf)[0]
    finally:
        engine.runner.step.stop()


def test_what_is_not_wired_yet_is_refused_by_name(tiny_model_dir):
    path, _ = tiny_model_dir("llama")
    with pytest.raises(ValueError, match="runs on the CPU .gloo. for now; not with an fp8 KV cache"):
        Engine.from_pretrained(path, tensor_parallel_size=2, kv_cache_dtype="fp8")
    with pytest.raises(ValueError, match="tensor_parallel_size must be >= 1"):
        Engine.from_pretrained(path, tensor_parallel_size=0)


def test_a_head_count_that_does_not_divide_is_refused_with_the_numbers(tiny_model_dir):
    path, _ = tiny_model_dir("llama")
    with pytest.raises(ValueError, match="tensor-parallel size 3 does not divide 4 attention heads"):
        Engine.from_pretrained(path, tensor_parallel_size=3)


def test_the_check_comes_before_any_worker_starts(tiny_model_dir):
    import torch.distributed as dist
    path, _ = tiny_model_dir("llama")
    with pytest.raises(ValueError, match="does not divide"):
        Engine.from_pretrained(path, tensor_parallel_size=3)
    assert not dist.is_initialized()  # no group was formed, so none is left behind


def test_a_dead_worker_fails_the_next_step_at_once_naming_it(tiny_model_dir):
    import time
    path, _ = tiny_model_dir("llama")
    engine = Engine.from_pretrained(path, tensor_parallel_size=2)
    step = engine.runner.step
    try:
        worker = step.workers[0]
        worker.kill()
        worker.join(timeout=10)
        start = time.monotonic()
        with pytest.raises(RuntimeError, match=r"worker rank 1 \(pid \d+\) exited with code -9"):
            engine.generate([[1, 2, 3]], GREEDY)
        assert time.monotonic() - start < 5
    finally:
        step.stop()
    import torch.distributed as dist
    assert not dist.is_initialized()


def start_tp2_server(path, **popen):
    """`graphllm serve --model PATH --eager -tp 2` on a free port, once healthy: (the process, its base URL)."""
    import subprocess
    import sys
    import time

    from tests.cli.test_serve import _healthy
    from tests.server.conftest import free_port
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "graphllm.cli", "serve", "--model", str(path), "--eager", "-tp", "2",
                             "--port", str(port), "--log-level", "warning"], **popen)
    base, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 120
    while not _healthy(base):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("server did not come up")
        time.sleep(0.2)
    return proc, base


def test_the_server_at_tp2_answers_the_openai_client_and_exits_cleanly(tiny_model_dir):
    """`graphllm serve --eager -tp 2`: a completion equals the TP = 1 engine's; SIGTERM ends the server
    and its worker with exit code 0, leaving no process behind."""
    import signal
    import subprocess

    import openai
    import psutil

    path, _ = tiny_model_dir("llama")
    expected = Engine.from_pretrained(path).generate([[1, 5, 9, 17]], GREEDY)[0].outputs[0].text
    proc, base = start_tp2_server(path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        workers = psutil.Process(proc.pid).children(recursive=True)
        assert workers  # the rank-1 worker (and multiprocessing's helper)
        client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=60)
        got = client.completions.create(model=client.models.list().data[0].id, prompt=[1, 5, 9, 17], max_tokens=16,
                                        temperature=0, extra_body={"ignore_eos": True})
        assert got.choices[0].text == expected
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        _, alive = psutil.wait_procs(workers, timeout=15)
        assert not alive, f"left behind: {alive}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


@pytest.mark.parametrize("arch, world_size", [("llama", 2), ("qwen2", 2), ("mistral", 4)])
def test_an_eager_rank_reads_only_its_slices(arch, world_size, tiny_model_dir, monkeypatch):
    """shard_step captures over placeholder weights and reads the rank's slices with get_slice: its weights
    equal the full model's sharded by the pass, and get_tensor (a whole tensor) runs only for the weights
    every rank holds whole (the norms)."""
    import graphllm.models.loader as loader
    from graphllm.ir import capture
    from graphllm.models import load_model
    from graphllm.passes.parallel.shard_tp import TP_GROUP, ShardTP
    from graphllm.runtime.tensor_parallel import shard_step
    path = tiny_model_dir(arch)[0]
    whole_reads, opened = [], loader.safe_open

    class Recording:
        def __init__(self, *args, **kwargs):
            self.file = opened(*args, **kwargs)

        def __enter__(self):
            file = self.file.__enter__()
            self.get_slice, self.keys = file.get_slice, file.keys
            self.get_tensor = lambda name: whole_reads.append(name) or file.get_tensor(name)
            return self

        def __exit__(self, *exc):
            return self.file.__exit__(*exc)

    model, config = load_model(path)
    for rank in range(world_size):
        want = capture(model, config, torch.float32, torch.device("cpu"))
        ShardTP.for_model(config, rank, world_size, TP_GROUP)(want)
        monkeypatch.setattr(loader, "safe_open", Recording)
        whole_reads.clear()
        got, _ = shard_step(path, rank, world_size, torch.float32, torch.device("cpu"))
        monkeypatch.setattr(loader, "safe_open", opened)
        want_weights, got_weights = want.weights, dict(got.named_parameters(remove_duplicate=False))
        assert set(got_weights) <= set(want_weights)
        for name, tensor in got_weights.items():
            assert torch.equal(tensor, want_weights[name]), name
        assert whole_reads and all("norm" in name for name in whole_reads), whole_reads
