"""Steps that carry prompt tokens (prefill, chunked prefill, prefill mixed with decodes) replayed from CUDA graphs,
one per token bucket (EngineConfig.cudagraph_mode "FULL"; GPU only).

Such a step launches hundreds of kernels and custom ops from Python. On the H200 that host work took about
24 ms a step whatever its size (benchmarks/RESULTS.md, "Where the host still waits"), more than the GPU work of
a step of a few hundred prompt tokens beside 256 decodes, so those steps ran at the host's pace. Replayed from
a graph, the step costs the host one copy of its inputs and one launch.

The graph of token bucket t runs t tokens of min(t - 1, max_seqs) sequences and returns that many logits
rows: a step of T <= t tokens and B sequences is padded to it (inputs.pad_mixed: padding sequences after the
real ones, K/V written into the padding block), the real rows' logits are the first ones. More tokens than
sequences in every bucket keeps the attention backend on its prefill path, whose launch grids depend on shapes
alone (the backend must say it captures such steps: AttentionBackend.mixed_step_graphs). The graphs share one
memory pool with the decode graphs and write their logits into one buffer, so only the largest bucket's
activations and one [max_seqs, vocab] logits buffer stay held. Steps larger than the largest bucket, and
speculative decoding's verify steps (more logits rows than sequences), run as before.
"""

import logging
import time
from typing import Callable

import numpy as np
import torch

from graphllm.backends import AttentionBackend
from graphllm.config import DEFAULT_MAX_CUDAGRAPH_CAPTURE_SIZE, mixed_token_buckets
from graphllm.ops.attention import use_backend
from graphllm.runtime.cudagraphs import capture_step, copy_padded
from graphllm.runtime.inputs import HostStep, packed_offsets, pad_mixed, unpack

logger = logging.getLogger("graphllm")


class MixedGraphRunner:
    def __init__(self, step: Callable[..., torch.Tensor], kv_caches: list[torch.Tensor], token_buckets: tuple[int, ...],
                 max_seqs: int, max_blocks_per_seq: int, padding_block: int, block_size: int, device: torch.device,
                 backend: AttentionBackend):
        self.step, self.kv_caches, self.backend = step, kv_caches, backend
        self.buckets = tuple(sorted(t for t in set(token_buckets) if t >= 2))
        self.seqs = {t: min(t - 1, max_seqs) for t in self.buckets}  # sequences of bucket t's graph
        self.padding_block, self.block_size, self.max_blocks = padding_block, block_size, max_blocks_per_seq
        t = self.buckets[-1]
        n = self.seqs[t]
        self.shapes = [(t,), (t,), (t,), (n, max_blocks_per_seq), (n,), (n + 1,), (n,)]  # HostStep's fields, largest
        self.device_buffer = torch.zeros(packed_offsets(self.shapes)[-1], dtype=torch.int64, device=device)
        self.static = HostStep(*unpack(self.device_buffer, self.shapes))
        pinned = device.type == "cuda"
        self.host_buffers = [torch.zeros_like(self.device_buffer, device="cpu", pin_memory=pinned) for _ in range(2)]
        self.graphs: dict[int, torch.cuda.CUDAGraph | StepReplay] = {}
        self.logits: torch.Tensor | None = None  # [max seqs, vocab]: every graph's logits rows
        self.pool = None
        self.capture_seconds, self.pool_bytes, self.replays = 0.0, 0, 0
        self._fitted: tuple[HostStep, int, HostStep] | None = None  # can_run's last answer, for run

    def can_run(self, host: HostStep) -> bool:
        """A step that carries prompt tokens (more tokens than sequences, one logits row a sequence at most)
        and fits a bucket."""
        fitted = self.bucket_for(host)
        self._fitted = None if fitted is None else (host, *fitted)
        return fitted is not None

    def static_inputs(self, t: int) -> tuple:
        s, n = self.static, self.seqs[t]
        return (s.input_ids[:t], s.positions[:t], s.slot_mapping[:t], s.block_tables[:n], s.seq_lens[:n],
                s.query_start_loc[:n + 1], s.logits_indices[:n], self.kv_caches)

    def bucket_for(self, host: HostStep) -> tuple[int, HostStep] | None:
        """The smallest bucket that holds host, and host padded to it; None for a decode step, a verify step
        (more logits rows than sequences) or a step no bucket holds."""
        t, b = len(host.input_ids), host.num_seqs
        if t <= b or len(host.logits_indices) > b:
            return None
        for bucket in self.buckets:
            if bucket >= t and self.seqs[bucket] >= b:
                padded = pad_mixed(host, bucket, self.seqs[bucket], self.padding_block, self.block_size,
                                   self.max_blocks)
                if padded is not None:
                    return bucket, padded
        return None

    def stage(self, padded: HostStep, slot: int) -> None:
        """Copy a padded step into the leading part of each static field, through pinned buffer `slot` (two
        alternate: the step before may still be copying out of the other, as CUDAGraphRunner.stage says)."""
        copy_padded(padded, self.host_buffers[slot], self.static)

    @torch.inference_mode()
    def capture(self) -> None:
        """One graph per bucket, largest first, into self.pool (the caller may set it to share one). On a CPU
        (tests) each bucket gets a StepReplay instead: the same staging and logits buffer, the step run on the
        static inputs at each replay."""
        cuda = self.device_buffer.is_cuda
        start, before = time.perf_counter(), torch.cuda.memory_reserved() if cuda else 0
        empty = np.zeros(0, np.int64)
        nothing = HostStep(empty, empty, empty, np.zeros((0, self.max_blocks), np.int64), empty,
                           np.zeros(1, np.int64), empty)
        for t in reversed(self.buckets):
            padded = pad_mixed(nothing, t, self.seqs[t], self.padding_block, self.block_size, self.max_blocks)
            if padded is None:  # more tokens than its padding sequences can hold (a very short max_model_len)
                continue
            self.stage(padded, slot=0)
            with use_backend(self.backend):
                self.backend.plan(padded.attention, graph_bucket=t)
                probed = self.logits is None
                if probed:  # the logits' width and dtype, from a call outside any capture: the warm-up too
                    out = self.step(*self.static_inputs(t))
                    self.logits = torch.empty((self.shapes[4][0], out.shape[1]), dtype=out.dtype, device=out.device)
                    del out
                if not cuda:
                    self.graphs[t] = StepReplay(self.step, self.static_inputs(t), self._keep_logits)
                    continue
                self.graphs[t], _ = capture_step(self.step, self.static_inputs(t), self.pool, after=self._keep_logits,
                                                 warm_up=not probed)
            self.pool = self.pool or self.graphs[t].pool()
        self.buckets = tuple(t for t in self.buckets if t in self.graphs)
        if cuda:
            torch.cuda.synchronize()
            self.pool_bytes = torch.cuda.memory_reserved() - before
        self.capture_seconds = time.perf_counter() - start

    def _keep_logits(self, out: torch.Tensor) -> None:
        """Inside a capture: copy the graph's logits [n, vocab] into the shared buffer, so that the graph's own
        output goes back to the pool once captured (one [max seqs, vocab] buffer for every bucket)."""
        self.logits[:out.shape[0]].copy_(out)

    def run(self, host: HostStep, fill: Callable[[torch.Tensor], None] | None = None) -> torch.Tensor:
        """Replay the graph of the smallest bucket that holds host (bucket_for must have found one); fill(input_ids)
        may then write device-side input ids (async scheduling): host's tokens keep their rows."""
        if self._fitted is not None and self._fitted[0] is host:
            bucket, padded = self._fitted[1:]
        else:
            bucket, padded = self.bucket_for(host)
        self._fitted = None
        self.stage(padded, slot=self.replays % 2)
        if fill is not None:
            fill(self.static.input_ids[:len(host.input_ids)])
        self.backend.plan(padded.attention, graph_bucket=bucket)
        self.graphs[bucket].replay()
        self.replays += 1
        return self.logits[:len(host.logits_indices)]


class StepReplay:
    """A CPU stand-in for a captured graph (MixedGraphRunner.capture on a CPU, for tests): replay() runs the step
    on the runner's static inputs and keeps its logits, what the graph would do."""

    def __init__(self, step: Callable[..., torch.Tensor], inputs: tuple, keep: Callable[[torch.Tensor], None]):
        self.step, self.inputs, self.keep = step, inputs, keep

    def replay(self) -> None:
        self.keep(self.step(*self.inputs))


def capture_mixed_graphs(step, kv_caches: list[torch.Tensor], config, limits, max_seqs: int, max_blocks_per_seq: int,
                         padding_block: int, device: torch.device,
                         backend: AttentionBackend) -> MixedGraphRunner | None:
    """The mixed-step graphs of cudagraph_mode FULL (config: EngineConfig, limits: setup.Limits), up to
    max_cudagraph_capture_size tokens; None where the backend cannot capture such steps (logged)."""
    if not backend.mixed_step_graphs:
        logger.warning("cudagraph_mode FULL: the %s attention backend plans or syncs on the host for steps with "
                       "prompt tokens; only decode steps replay CUDA graphs", backend.name)
        return None
    largest = min(config.max_cudagraph_capture_size or DEFAULT_MAX_CUDAGRAPH_CAPTURE_SIZE,
                  limits.max_num_batched_tokens)
    if largest < 2:  # a one-token budget has no step with more tokens than sequences
        return None
    runner = MixedGraphRunner(step, kv_caches, mixed_token_buckets(largest), max_seqs, max_blocks_per_seq,
                              padding_block, limits.block_size, device, backend)
    runner.capture()
    logger.info("captured %d mixed-step CUDA graphs (tokens %s, %d sequences at most) in %.2f s; they hold "
                "%.3f GiB", len(runner.graphs), list(runner.buckets), max_seqs, runner.capture_seconds,
                runner.pool_bytes / 2**30)
    return runner if runner.graphs else None
