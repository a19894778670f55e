"""Decode steps replayed from CUDA graphs, one per batch-size bucket (GPU only).

Static input buffers are sized for the largest bucket; graphs are captured largest first into
one shared memory pool, each after a warm-up call. A decode batch of B sequences is copied into
the first B rows, the rest padded (token 0 at position 0, writing its K/V to the reserved
padding slot), and the graph of the smallest bucket >= B is replayed.
"""

import time
from typing import Callable

import torch

from graphllm.runtime.inputs import StepInputs


class CUDAGraphRunner:
    def __init__(self, step: Callable[..., torch.Tensor], kv_caches: list[torch.Tensor], buckets: tuple[int, ...],
                 max_blocks_per_seq: int, padding_slot: int, device: torch.device):
        self.step, self.kv_caches, self.buckets = step, kv_caches, tuple(sorted(buckets))
        self.padding_slot = padding_slot
        n, i64 = self.buckets[-1], dict(dtype=torch.int64, device=device)
        self.input_ids = torch.zeros(n, **i64)
        self.positions = torch.zeros(n, **i64)
        self.slot_mapping = torch.full((n,), padding_slot, **i64)
        self.block_tables = torch.zeros(n, max_blocks_per_seq, **i64)
        self.seq_lens = torch.ones(n, **i64)
        self.query_start_loc = torch.arange(n + 1, **i64)  # decode: one token per sequence
        self.logits_indices = torch.arange(n, **i64)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.pool = None
        self.capture_seconds, self.pool_bytes, self.replays = 0.0, 0, 0

    def static_inputs(self, b: int) -> tuple:
        return (self.input_ids[:b], self.positions[:b], self.slot_mapping[:b], self.block_tables[:b],
                self.seq_lens[:b], self.query_start_loc[:b + 1], self.logits_indices[:b], self.kv_caches)

    @torch.inference_mode()
    def capture(self) -> None:
        start, before = time.perf_counter(), torch.cuda.memory_reserved()
        for b in reversed(self.buckets):
            graph = torch.cuda.CUDAGraph()
            self.step(*self.static_inputs(b))  # warm-up: allocator and library state settle outside capture
            torch.cuda.synchronize()
            with torch.cuda.graph(graph, pool=self.pool):
                self.outputs[b] = self.step(*self.static_inputs(b))
            self.pool = self.pool or graph.pool()
            self.graphs[b] = graph
        torch.cuda.synchronize()
        self.capture_seconds = time.perf_counter() - start
        self.pool_bytes = torch.cuda.memory_reserved() - before

    def can_run(self, inputs: StepInputs) -> bool:
        """Pure decode (one token per sequence, every one sampled) within the largest bucket."""
        b = inputs.meta.seq_lens.shape[0]
        return (b <= self.buckets[-1] and inputs.input_ids.shape[0] == b and inputs.logits_indices.shape[0] == b
                and inputs.meta.block_tables.shape[1] <= self.block_tables.shape[1])

    def reset_padding(self, b: int, bucket: int) -> None:
        """Rows b..bucket-1: token 0 at position 0, one cached token, K/V to the padding slot."""
        self.input_ids[b:bucket].zero_()
        self.positions[b:bucket].zero_()
        self.slot_mapping[b:bucket].fill_(self.padding_slot)
        self.seq_lens[b:bucket].fill_(1)

    def run(self, inputs: StepInputs) -> torch.Tensor:
        b = inputs.meta.seq_lens.shape[0]
        bucket = next(x for x in self.buckets if x >= b)
        m = inputs.meta
        self.input_ids[:b].copy_(inputs.input_ids)
        self.positions[:b].copy_(inputs.positions)
        self.slot_mapping[:b].copy_(m.slot_mapping)
        self.block_tables[:bucket].zero_()
        self.block_tables[:b, :m.block_tables.shape[1]].copy_(m.block_tables)
        self.seq_lens[:b].copy_(m.seq_lens)
        self.reset_padding(b, bucket)
        self.graphs[bucket].replay()
        self.replays += 1
        return self.outputs[bucket][:b]
