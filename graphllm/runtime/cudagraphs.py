"""Decode steps replayed from CUDA graphs, one per batch-size bucket (GPU only).

The static inputs of every graph are slices of one packed device buffer, sized for the largest
bucket; graphs are captured largest first into one shared memory pool, each after a warm-up
call. A decode batch of B sequences is written into a pinned host copy of that buffer (rows past
B padded: token 0 at position 0, its one cached token in the reserved padding block), copied
to the device, the attention backend is planned for the bucket, and the graph of the smallest
bucket >= B is replayed (under async scheduling while the step before is still running).
`run_steps` queues several greedy steps of one batch at once, each
staged in its own pinned buffer, the argmax of one feeding the input ids of the next.

With tokens_per_seq q > 1 the runner holds speculative decoding's verify graphs instead: every sequence
runs exactly q = k + 1 query tokens (its last token and up to k proposals, padded: inputs.pad_uniform),
all of them logits rows, and the graph of the smallest bucket >= B replays them; the real rows' logits
are gathered afterwards. Only backends that plan nothing on the host get these graphs (their prefill
kernels' grids depend on shapes alone).
"""

import time
from typing import Callable

import numpy as np
import torch

from graphllm.backends import AttentionBackend, HostMeta, TorchBackend
from graphllm.ops.attention import use_backend
from graphllm.runtime.inputs import HostStep, pack, packed_offsets, pad_uniform, uniform_fits, unpack
from graphllm.runtime.sampler import argmax_rows


def copy_padded(padded: HostStep, buffer: torch.Tensor, static: HostStep) -> None:
    """A padded step into the leading part of each static field (a graph's inputs: the fields of the largest
    bucket, row-major, so a smaller bucket's rows lead), through the pinned buffer `buffer`."""
    shapes = [a.shape for a in padded]
    pack(padded, out=buffer.numpy()[:packed_offsets(shapes)[-1]])
    for src, dst in zip(unpack(buffer, shapes), static):
        dst.view(-1)[:src.numel()].copy_(src.view(-1), non_blocking=True)


def capture_step(step: Callable[..., torch.Tensor], inputs: tuple, pool, after: Callable | None = None,
                 warm_up: bool = True):
    """(graph, output) of step(*inputs) captured into the memory pool `pool` (None: a new one), after a warm-up
    call outside the capture so that allocator and library state settle (warm_up False: the caller just made
    that call on the same inputs); after(output), when given, is captured behind the step and its result
    returned instead."""
    if warm_up:
        step(*inputs)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = step(*inputs)
        if after is not None:
            out = after(out)
    return graph, out


class CUDAGraphRunner:
    def __init__(self, step: Callable[..., torch.Tensor], kv_caches: list[torch.Tensor], buckets: tuple[int, ...],
                 max_blocks_per_seq: int, padding_block: int, block_size: int, device: torch.device,
                 backend: AttentionBackend | None = None, tokens_per_seq: int = 1):
        self.step, self.kv_caches, self.buckets = step, kv_caches, tuple(sorted(buckets))
        self.backend = backend or TorchBackend()
        self.padding_block, self.padding_slot = padding_block, padding_block * block_size
        self.block_size, self.q = block_size, tokens_per_seq
        n, t = self.buckets[-1], self.buckets[-1] * tokens_per_seq
        self.shapes = [(t,), (t,), (t,), (n, max_blocks_per_seq), (n,), (n + 1,), (t,)]  # HostStep's fields
        size = packed_offsets(self.shapes)[-1]
        self.device_buffer = torch.zeros(size, dtype=torch.int64, device=device)
        self.static = HostStep(*unpack(self.device_buffer, self.shapes))  # device tensors, HostStep's order
        self.host_buffers: list[torch.Tensor] = []  # pinned, one per step queued at once (run_steps)
        self.staged_slots: list[HostStep] = []  # numpy views of each
        self.staged = self.staging_slot(0)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.pool = None
        self.capture_seconds, self.pool_bytes, self.replays = 0.0, 0, 0

    def staging_slot(self, i: int) -> HostStep:
        """Pinned staging buffer i (made on first use), as numpy views in HostStep's order."""
        while len(self.host_buffers) <= i:
            n = self.buckets[-1]
            buffer = torch.zeros_like(self.device_buffer, device="cpu", pin_memory=self.device_buffer.is_cuda)
            staged = HostStep(*(t.numpy() for t in unpack(buffer, self.shapes)))
            staged.query_start_loc[:] = np.arange(n + 1) * self.q  # q tokens per sequence (decode: one)
            staged.logits_indices[:] = np.arange(n * self.q)
            self.host_buffers.append(buffer)
            self.staged_slots.append(staged)
        return self.staged_slots[i]

    def static_inputs(self, b: int) -> tuple:
        s, t = self.static, b * self.q
        return (s.input_ids[:t], s.positions[:t], s.slot_mapping[:t], s.block_tables[:b], s.seq_lens[:b],
                s.query_start_loc[:b + 1], s.logits_indices[:t], self.kv_caches)

    @torch.inference_mode()
    def capture(self) -> None:
        start, before = time.perf_counter(), torch.cuda.memory_reserved()
        nothing = HostMeta(np.zeros(1, np.int64), np.zeros(0, np.int64),
                           np.zeros((0, self.shapes[3][1]), np.int64))
        for b in reversed(self.buckets):
            if self.q > 1:
                planned = self._stage_uniform(nothing, b, slot=0)[0]
            else:
                self.stage(nothing, b)
                planned = nothing.padded(b, self.padding_block)
            with use_backend(self.backend):
                self.backend.plan(planned, graph_bucket=b)
                self.graphs[b], self.outputs[b] = capture_step(self.step, self.static_inputs(b), self.pool)
            self.pool = self.pool or self.graphs[b].pool()
        torch.cuda.synchronize()
        self.capture_seconds = time.perf_counter() - start
        self.pool_bytes = torch.cuda.memory_reserved() - before

    def can_run(self, host: HostStep) -> bool:
        """Pure decode (one token per sequence, every one sampled) within the largest bucket; with q > 1,
        1..q tokens per sequence, every one sampled (a verify step)."""
        b = host.num_seqs
        if self.q > 1:
            return uniform_fits(host, self.q, self.buckets[-1], self.shapes[3][1], self.block_size)
        return (b <= self.buckets[-1] and len(host.input_ids) == b and len(host.logits_indices) == b
                and host.block_tables.shape[1] <= self.shapes[3][1])

    def stage(self, host: HostStep | HostMeta, bucket: int, slot: int = 0) -> None:
        """Write the decode batch plus padding rows up to `bucket` into pinned buffer `slot`, then copy it over.

        A slot is reused only once the step that last copied out of it has finished: `run`
        alternates two slots (the step before is still in flight under async scheduling, the one
        before that was read back), and steps queued together (run_steps) each use their own.
        """
        s, b, m = self.staging_slot(slot), len(host.seq_lens), host.block_tables.shape[1]
        s.block_tables[:bucket] = 0
        s.block_tables[:b, :m] = host.block_tables
        s.block_tables[b:bucket, 0] = self.padding_block
        s.seq_lens[:b], s.seq_lens[b:bucket] = host.seq_lens, 1
        if isinstance(host, HostStep):
            s.input_ids[:b], s.positions[:b], s.slot_mapping[:b] = host.input_ids, host.positions, host.slot_mapping
        s.input_ids[b:bucket], s.positions[b:bucket], s.slot_mapping[b:bucket] = 0, 0, self.padding_slot
        for src, dst in zip(unpack(self.host_buffers[slot], self.shapes), self.static):
            dst[:bucket + 1].copy_(src[:bucket + 1], non_blocking=True)  # + 1: query_start_loc has B + 1

    def _stage_uniform(self, host: HostStep | HostMeta, bucket: int, slot: int) -> tuple[HostMeta, np.ndarray]:
        """stage() of a verify graph: host padded to bucket sequences of q tokens (inputs.pad_uniform);
        also returns the padded rows that are host's logits rows."""
        if isinstance(host, HostMeta):  # capture: no sequences
            empty = np.zeros(0, np.int64)
            host = HostStep(empty, empty, empty, host.block_tables, host.seq_lens, host.query_start_loc, empty)
        padded, rows = pad_uniform(host, self.q, bucket, self.padding_block, self.block_size, self.shapes[3][1])
        self.staging_slot(slot)
        copy_padded(padded, self.host_buffers[slot], self.static)
        return padded.attention, rows

    def run(self, host: HostStep, fill: Callable[[torch.Tensor], None] | None = None) -> torch.Tensor:
        """Replay the bucket's graph for `host`; fill(input_ids) may then write device-side input ids
        (async scheduling). The staging buffer alternates between two, because the previous step's
        copy out of its buffer may not have run yet (its tokens are read back after this call)."""
        b = host.num_seqs
        bucket = next(x for x in self.buckets if x >= b)
        if self.q > 1:
            assert fill is None, "verify graphs take no device-side input ids"
            planned, rows = self._stage_uniform(host, bucket, slot=self.replays % 2)
        else:
            self.stage(host, bucket, slot=self.replays % 2)
            if fill is not None:
                fill(self.static.input_ids[:b])
            planned = host.attention.padded(bucket, self.padding_block)
        self.backend.plan(planned, graph_bucket=bucket)
        self.graphs[bucket].replay()
        self.replays += 1
        if self.q > 1:
            return self.outputs[bucket][torch.from_numpy(rows).to(self.device_buffer.device)]
        return self.outputs[bucket][:b]

    def run_steps(self, hosts: list[HostStep]) -> torch.Tensor:
        """Greedy decode steps queued back to back: step j + 1's tokens are step j's argmax, written
        into the graph's input ids on the device. hosts: the steps' inputs (one batch, positions
        moving on); returns the [len(hosts), B] tokens, still on the device (nothing waited for)."""
        assert not self.backend.plans_on_host, "queued replays need a backend that plans nothing per step"
        b = hosts[0].num_seqs
        bucket = next(x for x in self.buckets if x >= b)
        tokens = []
        for slot, host in enumerate(hosts):
            self.stage(host, bucket, slot)
            if tokens:
                self.static.input_ids[:b].copy_(tokens[-1])
            self.graphs[bucket].replay()
            self.replays += 1
            tokens.append(argmax_rows(self.outputs[bucket][:b]))
        return torch.stack(tokens)
