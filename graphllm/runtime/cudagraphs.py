"""Decode steps replayed from CUDA graphs, one per batch-size bucket (GPU only).

The static inputs of every graph are slices of one packed device buffer, sized for the largest
bucket; graphs are captured largest first into one shared memory pool, each after a warm-up
call. A decode batch of B sequences is written into a pinned host copy of that buffer (rows past
B padded: token 0 at position 0, its one cached token in the reserved padding block), copied
to the device, the attention backend is planned for the bucket, and the graph of the smallest
bucket >= B is replayed (under async scheduling while the step before is still running).
`run_steps` queues several greedy steps of one batch at once, each
staged in its own pinned buffer, the argmax of one feeding the input ids of the next.
"""

import time
from typing import Callable

import numpy as np
import torch

from graphllm.backends import AttentionBackend, HostMeta, TorchBackend
from graphllm.ops.attention import use_backend
from graphllm.runtime.inputs import HostStep, packed_offsets, unpack
from graphllm.runtime.sampler import argmax_rows


class CUDAGraphRunner:
    def __init__(self, step: Callable[..., torch.Tensor], kv_caches: list[torch.Tensor], buckets: tuple[int, ...],
                 max_blocks_per_seq: int, padding_block: int, block_size: int, device: torch.device,
                 backend: AttentionBackend | None = None):
        self.step, self.kv_caches, self.buckets = step, kv_caches, tuple(sorted(buckets))
        self.backend = backend or TorchBackend()
        self.padding_block, self.padding_slot = padding_block, padding_block * block_size
        n = self.buckets[-1]
        self.shapes = [(n,), (n,), (n,), (n, max_blocks_per_seq), (n,), (n + 1,), (n,)]  # HostStep's fields
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
            staged.query_start_loc[:] = np.arange(n + 1)  # decode: one token per sequence
            staged.logits_indices[:] = np.arange(n)
            self.host_buffers.append(buffer)
            self.staged_slots.append(staged)
        return self.staged_slots[i]

    def static_inputs(self, b: int) -> tuple:
        s = self.static
        return (s.input_ids[:b], s.positions[:b], s.slot_mapping[:b], s.block_tables[:b], s.seq_lens[:b],
                s.query_start_loc[:b + 1], s.logits_indices[:b], self.kv_caches)

    @torch.inference_mode()
    def capture(self) -> None:
        start, before = time.perf_counter(), torch.cuda.memory_reserved()
        nothing = HostMeta(np.zeros(1, np.int64), np.zeros(0, np.int64),
                           np.zeros((0, self.shapes[3][1]), np.int64))
        for b in reversed(self.buckets):
            graph = torch.cuda.CUDAGraph()
            self.stage(nothing, b)
            with use_backend(self.backend):
                self.backend.plan(nothing.padded(b, self.padding_block), graph_bucket=b)
                self.step(*self.static_inputs(b))  # warm-up: allocator and library state settle outside capture
                torch.cuda.synchronize()
                with torch.cuda.graph(graph, pool=self.pool):
                    self.outputs[b] = self.step(*self.static_inputs(b))
            self.pool = self.pool or graph.pool()
            self.graphs[b] = graph
        torch.cuda.synchronize()
        self.capture_seconds = time.perf_counter() - start
        self.pool_bytes = torch.cuda.memory_reserved() - before

    def can_run(self, host: HostStep) -> bool:
        """Pure decode (one token per sequence, every one sampled) within the largest bucket."""
        b = host.num_seqs
        return (b <= self.buckets[-1] and len(host.input_ids) == b and len(host.logits_indices) == b
                and host.block_tables.shape[1] <= self.shapes[3][1])

    def stage(self, host: HostStep | HostMeta, bucket: int, slot: int = 0) -> None:
        """Write the batch plus padding rows up to `bucket` into pinned buffer `slot`, then copy it over.

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

    def run(self, host: HostStep, fill: Callable[[torch.Tensor], None] | None = None) -> torch.Tensor:
        """Replay the bucket's graph for `host`; fill(input_ids) may then write device-side input ids
        (async scheduling). The staging buffer alternates between two, because the previous step's
        copy out of its buffer may not have run yet (its tokens are read back after this call)."""
        b = host.num_seqs
        bucket = next(x for x in self.buckets if x >= b)
        self.stage(host, bucket, slot=self.replays % 2)
        if fill is not None:
            fill(self.static.input_ids[:b])
        self.backend.plan(host.attention.padded(bucket, self.padding_block), graph_bucket=bucket)
        self.graphs[bucket].replay()
        self.replays += 1
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
