"""Tensor parallelism when things go wrong (CPU, gloo, real processes): an idle worker waits for the next step
however long it takes, a step cut short on rank 0 stops the workers at once, a worker's failure is named by its
rank and its own message, and no process is left waiting in a collective or at the rendezvous."""

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from graphllm import Engine, SamplingParams
from graphllm.runtime.tensor_parallel import RankStep

pytestmark = pytest.mark.slow  # starts worker processes

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
REPO = Path(__file__).resolve().parents[2]


def _idle_rank(rank: int, init_method: str, got) -> None:
    """Rank 0 idles past the group's timeout before it sends a step; rank 1 waits for it."""
    from graphllm.runtime.tensor_parallel import receive_step, send_step
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=2, timeout=timedelta(seconds=2))
    try:
        if rank == 0:
            time.sleep(5)
            inputs = (torch.tensor([7, 8]), torch.tensor([0, 1]), torch.tensor([0, 1]), torch.tensor([[0]]),
                      torch.tensor([2]), torch.tensor([0, 2]), torch.tensor([1]))
            send_step(inputs, 4, 16)
        else:
            received = receive_step()
            got.put(received[0][0].tolist())
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_an_idle_worker_waits_for_the_next_step_past_the_collective_timeout():
    """The bug: a worker's wait for the next step's header timed out with the group (TIMEOUT, 120 s), so an engine
    (a server) idle for two minutes had lost its worker and failed its next request."""
    from tests.server.conftest import free_port
    ctx = mp.get_context("spawn")
    got = ctx.Queue()
    init_method = f"tcp://127.0.0.1:{free_port()}"
    ranks = [ctx.Process(target=_idle_rank, args=(rank, init_method, got)) for rank in range(2)]
    for proc in ranks:
        proc.start()
    for proc in ranks:
        proc.join(timeout=60)
    assert [proc.exitcode for proc in ranks] == [0, 0]
    assert got.get(timeout=1) == [7, 8]


def test_a_step_cut_short_on_rank_0_stops_the_workers_and_refuses_the_next_step(tiny_model_dir):
    """The bug: a step that failed on rank 0 after its inputs went out (Ctrl-C does the same) left the worker in a
    collective rank 0 never joined; the next step then waited out the 120 s timeout, and so did exiting (the
    finalizer's STOP). Here rank 0 alone fails: its KV-cache list is one layer short."""
    from graphllm.backends import TorchBackend
    from graphllm.ops.attention import use_backend
    path, _ = tiny_model_dir("llama")
    engine = Engine.from_pretrained(path, tensor_parallel_size=2)
    step = engine.runner.step
    try:
        inputs = (torch.tensor([1, 5, 9]), torch.arange(3), torch.arange(3), torch.tensor([[0]]), torch.tensor([3]),
                  torch.tensor([0, 3]), torch.tensor([2]))
        with torch.inference_mode(), use_backend(TorchBackend()), pytest.raises(IndexError):
            step(*inputs, engine.runner.kv_caches[:1])
        start = time.monotonic()
        with pytest.raises(RuntimeError, match="a step was cut short by IndexError.*start a new engine"):
            engine.generate([[1, 2, 3]], GREEDY)
        assert time.monotonic() - start < 5
        assert not any(proc.is_alive() for proc in step.workers)
    finally:
        step.stop()
    assert not dist.is_initialized()


def test_a_worker_killed_mid_generation_is_named(tiny_model_dir):
    """The bug: a worker killed while rank 0 waited in a collective failed the step with gloo's "Connection reset by
    peer", naming no rank."""
    import threading
    path, _ = tiny_model_dir("llama")
    engine = Engine.from_pretrained(path, tensor_parallel_size=2)
    step = engine.runner.step
    try:
        threading.Timer(1.0, step.workers[0].kill).start()
        start = time.monotonic()
        with pytest.raises(RuntimeError, match=r"worker rank 1 \(pid \d+\) exited with code -9"):
            while time.monotonic() - start < 60:
                engine.generate([[1, 2, 3]] * 4, SamplingParams(max_tokens=64, ignore_eos=True))
    finally:
        step.stop()


def test_a_worker_that_cannot_build_its_step_fails_the_load_with_its_message(tiny_model_dir, tmp_path):
    """The bug: rank 1's weights file damaged (sha256, which only the rank reading it checks): the load succeeded
    and the first step failed with "worker rank 1 exited with code 1"; the reason was only on stderr."""
    import shutil

    from graphllm.config import EngineConfig
    from tests.conftest import compile_cached
    path, _ = tiny_model_dir("llama")
    art = tmp_path / "art"
    shutil.copytree(compile_cached(EngineConfig(model=str(path), dtype="float32", tensor_parallel_size=2), path), art)
    weights = art / "weights.rank1.safetensors"
    data = bytearray(weights.read_bytes())
    data[-64:] = bytes(64)  # the last tensor's bytes: same size, another hash
    weights.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="worker rank 1 could not build its step: .*weights.rank1.safetensors is "
                                         "damaged"):
        Engine.load(art)
    assert not dist.is_initialized()


class _HangingRank(RankStep):
    """Rank 1 hangs while building (a stuck filesystem, a deadlock): alive, never done."""

    def build(self, rank: int, world_size: int, device: torch.device) -> tuple:
        if rank == 1:
            time.sleep(3600)
        return super().build(rank, world_size, device)


def test_a_worker_that_hangs_while_building_fails_the_load_and_is_stopped(tiny_model_dir):
    """The bug (s37 left it alone): rank 0 waited without limit for a worker that was alive but never built its
    step, so the load (a server's start) hung. Now it waits max(patience, 2 x rank 0's build time) after its own."""
    from graphllm.runtime.tensor_parallel import start_tensor_parallel
    path, _ = tiny_model_dir("llama")
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="worker rank 1 .* is still building its step \\d+ s after rank 0 built its "
                                           "own .*taken to hang"):
        start_tensor_parallel(2, _HangingRank(str(path), False, torch.float32), torch.float32, patience=3.0)
    assert time.monotonic() - start < 90
    assert not dist.is_initialized()
    assert not [p for p in mp.active_children() if p.is_alive()]  # the hung worker was stopped


def test_a_second_engine_in_the_process_is_refused_and_the_first_keeps_running(tiny_model_dir):
    """The bug: the second engine's failure (the default group formed twice) sent its STOP to the first engine's
    workers and destroyed the first engine's group."""
    path, _ = tiny_model_dir("llama")
    first = Engine.from_pretrained(path, tensor_parallel_size=2)
    try:
        with pytest.raises(RuntimeError, match="one tensor-parallel engine per process"):
            Engine.from_pretrained(path, tensor_parallel_size=2)
        assert len(first.generate([[1, 2, 3]], GREEDY)[0].outputs[0].token_ids) == 8
    finally:
        first.runner.step.stop()


def test_a_script_without_a_main_guard_is_named_at_once(tiny_model_dir, tmp_path):
    """The bug: the spawned worker, importing the script, failed before it joined; rank 0 waited out the rendezvous
    (121 s) and raised "Timed out ... waiting for clients"."""
    path, _ = tiny_model_dir("llama")
    script = tmp_path / "no_guard.py"
    script.write_text(f"from graphllm import Engine\nEngine.from_pretrained({str(path)!r}, tensor_parallel_size=2)\n")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=90, env=env)
    assert out.returncode == 1
    assert 'worker rank 1' in out.stderr and 'needs an `if __name__ == "__main__":` guard' in out.stderr


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_signal_to_a_tp2_servers_group_drains_its_streams_and_leaves_no_process(signum, tiny_model_dir):
    """The bug: a terminal's Ctrl-C reaches the whole process group; the worker died of it at once, so the stream
    in flight ended in a 500 and the server exited 1, instead of draining (exit 0). The same for a SIGTERM to the
    group (`kill -TERM -PGID`, a supervisor stopping the group): the worker died of it before rank 0 drained."""
    import openai
    import psutil

    from tests.runtime.test_tensor_parallel import start_tp2_server
    path, _ = tiny_model_dir("llama")
    proc, base = start_tp2_server(path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  start_new_session=True)  # its own group, as in a terminal
    try:
        workers = psutil.Process(proc.pid).children(recursive=True)
        client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=60)
        chunks = client.completions.create(model=client.models.list().data[0].id, prompt=[1, 5, 9], max_tokens=100,
                                           temperature=0, stream=True, extra_body={"ignore_eos": True})
        first = next(iter(chunks))
        os.killpg(proc.pid, signum)
        assert [first, *chunks][-1].choices[0].finish_reason == "length"  # the stream ran to its max_tokens
        assert proc.wait(timeout=60) == 0
        _, alive = psutil.wait_procs(workers, timeout=15)
        assert not alive, f"left behind: {alive}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
