"""Tensor parallelism on one node (EngineConfig.tensor_parallel_size = N): the engine's process is rank
0 and starts ranks 1..N-1 as worker processes (torch.multiprocessing, spawn) joined by torch.distributed.

Every rank runs its own shard of the captured step (graphllm/passes/parallel/shard_tp.py: its heads and
its slice of the MLP, all-reduces after o_proj and down_proj) over its own KV cache, which holds its
KV heads with the same block layout. Rank 0 alone schedules and samples. Each step it broadcasts the
step's flat int64 inputs: a header [T, B, M, N, cache blocks, block size] then one buffer holding
input_ids, positions, slot_mapping, block_tables, seq_lens, query_start_loc and logits_indices; the
workers run their shard on them, and the shard's all-reduces keep the ranks in step. A header of
STOP ends the workers; so does the engine's process exiting (they are daemons, and a finalizer stops
them when the step is dropped). A worker that exits fails rank 0's next step at once, naming it (the
engine then reports itself dead); a rank lost inside a collective fails it after TIMEOUT (but not the
workers' wait for the next header: an engine may idle for hours). A step cut short on rank 0 (Ctrl-C,
an error) leaves the ranks in different collectives: rank 0 then ends the workers at once and refuses
further steps (a STOP, or the next step, would wait out TIMEOUT).

Spawned workers build their step first, tell rank 0 how it went over a pipe, and join at the address
it sends back: rank 0 raises a worker's build error as its own, and names at once a worker that died
before joining (a script without an `if __name__ == "__main__":` guard), not after the rendezvous's
TIMEOUT. They run in a process group of their own and ignore SIGINT: a terminal's Ctrl-C, or a SIGTERM to the
whole group, reaches rank 0 alone, which decides (the server drains first).

Under torchrun (EngineConfig.distributed_init_method, from the CLI) the other ranks are torchrun's processes,
on this node or others: each runs worker_main itself and they meet rank 0 at torchrun's address.

A rank's step is compiled (an artifact compiled with --tensor-parallel-size N: one step, the rank's own
weights file) or eager (the step captured over placeholder weights, sharded, then given the rank's slices
of the checkpoint: shard_step). Either way a rank reads only its part of the weights. For now: CPU with
gloo, the torch attention backend, no CUDA graphs.
"""

import dataclasses
import logging
import os
import signal
import socket
import sys
import time
import weakref
from datetime import timedelta
from multiprocessing import connection
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from graphllm.backends import TorchBackend
from graphllm.ir import capture
from graphllm.models.config import ModelConfig
from graphllm.models.loader import load_model_shapes, read_rank_tensors
from graphllm.ops.attention import use_backend
from graphllm.passes.parallel.shard_tp import TP_GROUP, ShardTP, local_kv_heads
from graphllm.runtime.kv_cache import allocate_kv_caches

logger = logging.getLogger(__name__)
STOP = -1
HEADER = 6  # T, B, M, N, cache blocks, block size
TIMEOUT = timedelta(seconds=120)  # a collective waiting longer than this means a rank is gone
# a spawned worker still building its step this long after rank 0 has built its own (or twice rank 0's build time,
# if longer) is taken to hang, and the load fails naming it
WORKER_BUILD_PATIENCE = 300.0
IDLE = timedelta(days=365)  # but a worker waits this long for the next step: an idle engine has lost no rank


def local_model_config(config: ModelConfig, world_size: int) -> ModelConfig:
    """The config each rank's KV cache is shaped by: its KV heads."""
    return dataclasses.replace(config, num_key_value_heads=local_kv_heads(config.num_key_value_heads, world_size))


def shard_step(path: str | Path, rank: int, world_size: int, dtype: torch.dtype,
               device: torch.device) -> tuple[torch.fx.GraphModule, ModelConfig]:
    """This rank's eager step and the model's config. The step is captured over placeholder weights (no
    memory), sharded, then given the rank's weights: its slices of the sharded ones (safetensors get_slice)
    and the replicated ones whole. No rank reads the whole checkpoint."""
    model, config = load_model_shapes(path, dtype, device)
    graph = capture(model, config, dtype, device)
    del model
    shard = ShardTP.for_model(config, rank, world_size, TP_GROUP, eager=True)
    shard(graph)
    graph.drop_unused_weights()  # a tied embedding's second name, which no node reads
    graph.recompile()
    read_rank_weights(graph, shard.plan, path, config, dtype, device)
    return graph.gm, config


def read_rank_weights(graph, plan: dict, path: str | Path, config: ModelConfig, dtype: torch.dtype,
                      device: torch.device) -> None:
    """Give the graph's parameters their checkpoint tensors, each as the RankSlice plan names (or whole)."""
    params = dict(graph.gm.named_parameters(remove_duplicate=False))
    names = {}  # graph name -> checkpoint name ("model." is the StepModule's attribute)
    for name in params:
        stored = name.removeprefix("model.")
        tied = config.tie_word_embeddings and stored == "lm_head.weight"  # the checkpoint stores it once
        names[name] = "model.embed_tokens.weight" if tied else stored
    tensors = read_rank_tensors(path, {names[n]: plan.get(n) for n in params}, dtype, device)
    for name, stored in names.items():
        if tensors[stored].shape != params[name].shape:
            raise RuntimeError(f"{stored}: read {tuple(tensors[stored].shape)}, the rank's step has "
                               f"{tuple(params[name].shape)}")
        owner, _, attr = name.rpartition(".")
        graph.gm.get_submodule(owner).register_parameter(attr, torch.nn.Parameter(tensors[stored],
                                                                                  requires_grad=False))


def send_step(inputs: tuple, num_blocks: int, block_size: int) -> None:
    """Broadcast one step's inputs (rank 0)."""
    input_ids, positions, slot_mapping, block_tables, seq_lens, query_start_loc, logits_indices = inputs
    t, (b, m), n = input_ids.shape[0], block_tables.shape, logits_indices.shape[0]
    dist.broadcast(torch.tensor([t, b, m, n, num_blocks, block_size], dtype=torch.int64), src=0)
    dist.broadcast(torch.cat([x.reshape(-1).to(torch.int64) for x in inputs]), src=0)


def receive_step() -> tuple[tuple, int, int] | None:
    """One step's inputs (ranks 1..N-1), their cache block count and block size; None: stop."""
    header = torch.empty(HEADER, dtype=torch.int64)
    opts = dist.BroadcastOptions()
    opts.rootRank, opts.timeout = 0, IDLE
    dist.group.WORLD.broadcast([header], opts).wait()
    t, b, m, n, num_blocks, block_size = header.tolist()
    if t == STOP:
        return None
    flat = torch.empty(3 * t + b * m + b + (b + 1) + n, dtype=torch.int64)
    dist.broadcast(flat, src=0)
    ids, pos, slots, tables, lens, starts, sampled = flat.split([t, t, t, b * m, b, b + 1, n])
    return (ids, pos, slots, tables.view(b, m), lens, starts, sampled), num_blocks, block_size


class TensorParallelStep:
    """Rank 0's step: broadcast the inputs, then run its own shard (same signature as the step)."""

    def __init__(self, shard: torch.fx.GraphModule, workers: list):
        self.shard, self.workers = shard, workers
        self.failure: str | None = None  # why the ranks are out of step, once a step was cut short
        self._finalizer = weakref.finalize(self, stop_workers, workers)

    def __call__(self, input_ids, positions, slot_mapping, block_tables, seq_lens, query_start_loc,
                 logits_indices, kv_caches):
        inputs = (input_ids, positions, slot_mapping, block_tables, seq_lens, query_start_loc, logits_indices)
        self.check_workers()
        try:
            send_step(inputs, kv_caches[0].shape[1], kv_caches[0].shape[2])
            return self.shard(*inputs, kv_caches)
        except BaseException as e:
            if (gone := self.fail(e)) is not None:
                raise RuntimeError(gone) from e
            raise

    def check_workers(self) -> None:
        """A worker that has exited fails the step at once (not after the collective's timeout)."""
        if self.failure is not None:
            raise RuntimeError(f"{self.failure}; the tensor-parallel workers were stopped: start a new engine")
        if (gone := exited_worker(self.workers)) is not None:
            raise RuntimeError(gone)

    def fail(self, error: BaseException) -> str | None:
        """A step cut short: end the workers now, since they wait in a collective rank 0 will not join. Returns
        what ended a worker that died (the usual cause of a collective's error: gloo's message names no rank)."""
        gone = exited_worker(self.workers, wait=1.0 if isinstance(error, RuntimeError) else 0)
        self.failure = gone or f"a step was cut short by {error!r}"
        self._finalizer.detach()
        stop_workers(self.workers, tell=False)
        return gone

    def stop(self) -> None:
        self._finalizer()


def exited_worker(workers: list, wait: float = 0) -> str | None:
    """What ended the first worker that has exited (waiting up to `wait` seconds for one to); None: none has."""
    ended = set(connection.wait([proc.sentinel for proc in workers], timeout=wait)) if workers else set()
    for rank, proc in enumerate(workers, start=1):
        if proc.sentinel in ended:
            proc.join(timeout=5)  # its sentinel closes as it exits, a moment before its exit code is there
            return (f"tensor-parallel worker rank {rank} (pid {proc.pid}) exited with code {proc.exitcode}; "
                    f"the engine cannot run without it")
    return None


def stop_workers(workers: list, tell: bool = True) -> None:
    """Stop the workers: tell them (a STOP header) and wait a little, then make sure they are gone. tell=False
    when they cannot hear it (no group formed yet, or a step cut short): they are ended at once."""
    if tell:
        try:
            dist.broadcast(torch.tensor([STOP] + [0] * (HEADER - 1), dtype=torch.int64), src=0)
        except Exception:  # a worker already gone: the group is broken; the terminate below still runs
            pass
    for proc in workers:
        proc.join(timeout=10 if tell else 0)
        if proc.is_alive():
            proc.terminate()
            proc.join(timeout=5)
    if dist.is_initialized():
        dist.destroy_process_group()


@dataclasses.dataclass(frozen=True)
class RankStep:
    """How a rank builds its step: from the model folder (eager: load, capture, shard_tp) or from a
    tensor-parallel artifact (its compiled step and the rank's own weights file)."""
    source: str  # the model folder or the artifact
    compiled: bool
    dtype: torch.dtype

    def build(self, rank: int, world_size: int, device: torch.device) -> tuple:
        """(the step, the ModelConfig its KV cache is shaped by)."""
        if self.compiled:
            from graphllm.compiler.artifact import read_manifest
            from graphllm.compiler.loading import load_compiled_step
            model_config, _, step = load_compiled_step(Path(self.source), read_manifest(Path(self.source)), device,
                                                       rank)
            return step, local_model_config(model_config, world_size)
        step, config = shard_step(self.source, rank, world_size, self.dtype, device)
        return step, local_model_config(config, world_size)


def join_group(rank: int, world_size: int, init_method: str) -> None:
    """Form the default group the shards' collectives name (TP_GROUP)."""
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size, timeout=TIMEOUT)
    if dist.group.WORLD.group_name != TP_GROUP:
        raise RuntimeError(f"the default process group is named {dist.group.WORLD.group_name!r}, but the sharded "
                           f"steps' collectives name {TP_GROUP!r}: was another group formed first?")


def worker_main(rank: int, world_size: int, init_method: str, rank_step: RankStep, kv_dtype: torch.dtype) -> None:
    """Ranks 1..N-1 (started elsewhere: torchrun): build the rank's step, then serve rank 0's steps."""
    serve_steps(rank, world_size, init_method, rank_step.build(rank, world_size, torch.device("cpu")), kv_dtype)


def serve_steps(rank: int, world_size: int, init_method: str, built: tuple, kv_dtype: torch.dtype) -> None:
    """Join rank 0, then run every step it broadcasts until it says stop."""
    join_group(rank, world_size, init_method)
    try:
        device = torch.device("cpu")
        step, local = built
        backend, caches = TorchBackend(), None
        with torch.inference_mode(), use_backend(backend):
            while (received := receive_step()) is not None:
                inputs, num_blocks, block_size = received
                if caches is None or caches[0].shape[1] != num_blocks:
                    caches = allocate_kv_caches(local, num_blocks, block_size, kv_dtype, device)
                step(*inputs, caches)
    finally:
        dist.destroy_process_group()


def spawned_worker(pipe, rank: int, world_size: int, rank_step: RankStep, kv_dtype: torch.dtype) -> None:
    """A worker process spawned here: build the step, tell rank 0 (None, or the error's kind and message),
    join at the address rank 0 sends back once every rank has built its step, and serve steps. Once they stop
    (the rank has left the group) the process exits without the interpreter's teardown, where a C++ thread
    still joinable (the gloo group's, the compiled step's) can abort it: "terminate called without an active
    exception", exit code -6, once in a full CPU test run. An exception still ends it the usual way, with its
    traceback and a non-zero code."""
    # a signal to the whole process group (a terminal's Ctrl-C, `kill -TERM -PGID`) is rank 0's to handle: it drains,
    # then stops the workers. So a worker leaves the group (rank 0's own signals to it, and its death, still end it)
    if hasattr(os, "setpgid"):
        os.setpgid(0, 0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        built = rank_step.build(rank, world_size, torch.device("cpu"))
    except ValueError as e:  # a bad model folder or artifact: rank 0 raises it, as it would its own
        pipe.send((ValueError, str(e)))
        sys.exit(1)
    except Exception as e:
        pipe.send((RuntimeError, f"{type(e).__name__}: {e}"))
        raise
    pipe.send(None)
    serve_steps(rank, world_size, pipe.recv(), built, kv_dtype)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def spawn_workers(world_size: int, rank_step: RankStep, kv_dtype: torch.dtype) -> tuple[list, list]:
    """Ranks 1..N-1 as daemon processes, each with its pipe to rank 0."""
    ctx, workers, pipes = mp.get_context("spawn"), [], []
    for rank in range(1, world_size):
        ours, theirs = ctx.Pipe()
        workers.append(ctx.Process(target=spawned_worker, args=(theirs, rank, world_size, rank_step, kv_dtype),
                                   daemon=True))
        workers[-1].start()
        theirs.close()  # the worker holds the other copy: its exit ends the pipe (EOFError in await_workers)
        pipes.append(ours)
    return workers, pipes


def await_workers(workers: list, pipes: list, patience: float = WORKER_BUILD_PATIENCE) -> None:
    """Wait until every spawned worker has built its step; a worker's error, or its death, is raised here, and so
    is a worker still building `patience` seconds from now (alive but hung: it was waited for without limit)."""
    deadline = time.monotonic() + patience
    for rank, (proc, pipe) in enumerate(zip(workers, pipes), start=1):
        if not pipe.poll(max(0.0, deadline - time.monotonic())):
            raise RuntimeError(f"tensor-parallel worker rank {rank} (pid {proc.pid}) is still building its step "
                               f"{patience:.0f} s after rank 0 built its own (the same work on a shard of the same "
                               "size): taken to hang; stopping the workers")
        try:
            error = pipe.recv()
        except EOFError:  # it exited before it could say
            proc.join(timeout=5)
            raise RuntimeError(f"tensor-parallel worker rank {rank} (pid {proc.pid}) exited with code {proc.exitcode} "
                               "before building its step (its error is above); a script that starts a tensor-parallel "
                               "engine needs an `if __name__ == \"__main__\":` guard: each worker imports it") from None
        if error is not None:
            kind, message = error
            raise kind(f"tensor-parallel worker rank {rank} could not build its step: {message}")


def start_tensor_parallel(world_size: int, rank_step: RankStep, kv_dtype: torch.dtype,
                          rank0: tuple | None = None, init_method: str | None = None,
                          patience: float = WORKER_BUILD_PATIENCE) -> tuple[TensorParallelStep, ModelConfig]:
    """Join ranks 1..N-1 as rank 0 and return rank 0's step with the ModelConfig of its KV cache (rank0: its
    (step, config) when the caller already built it). init_method None: start them here (spawned processes,
    meeting on a free local port once every rank has built its step); else they were started elsewhere
    (torchrun: worker_main on every other rank) and meet at init_method. A failure after the workers start
    stops them before it propagates, and so does a spawned worker still building its step when rank 0 has built
    its own and waited max(patience, twice its own build time) more."""
    if dist.is_initialized():  # its STOP and destroy_process_group below would end the other engine
        raise RuntimeError("this process already holds a torch.distributed group (another tensor-parallel engine?): "
                           "one tensor-parallel engine per process; shut the other down first (engine.shutdown())")
    workers, pipes = spawn_workers(world_size, rank_step, kv_dtype) if init_method is None else ([], [])
    try:
        start = time.monotonic()
        step, local = rank0 or rank_step.build(0, world_size, torch.device("cpu"))
        if init_method is None:
            await_workers(workers, pipes, max(patience, 2 * (time.monotonic() - start)))
            init_method = f"tcp://127.0.0.1:{_free_port()}"
            for pipe in pipes:
                pipe.send(init_method)
        join_group(0, world_size, init_method)
        logger.info("tensor parallel: %d ranks (gloo, %s), rank 0 schedules", world_size, init_method)
        return TensorParallelStep(step, workers), local
    except BaseException:
        stop_workers(workers, tell=dist.is_initialized())
        raise


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
