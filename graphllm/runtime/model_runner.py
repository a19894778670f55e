"""Runs one scheduled batch through the step: flat inputs in, logits of sampled rows out.

The step is any callable over the flat tensors of StepInputs (graphllm.ir.STEP_INPUT_NAMES):
the eager StepModule, or the compiled artifact. That seam is the whole difference between the
eager and compiled engines. The attention backend is planned here, on the host, before the step
(CUDAGraphRunner plans it for the bucket it replays), and is active only during the step. Decode steps
replay the decode graphs, speculative decoding's verify steps the verify graphs of the fewest tokens a sequence
that hold them, where they fit, and under cudagraph_mode FULL the other steps the mixed-step graph of the
smallest token bucket that holds them (MixedGraphRunner).
"""

from typing import Callable, Sequence

import torch

from graphllm.backends import AttentionBackend, TorchBackend
from graphllm.ops.attention import use_backend
from graphllm.runtime.cudagraphs import CUDAGraphRunner
from graphllm.runtime.mixed_graphs import MixedGraphRunner
from graphllm.runtime.inputs import advance, fill_pending, pending_inputs, prepare_step
from graphllm.runtime.scheduler import ScheduledSeq


class ModelRunner:
    def __init__(self, step: Callable[..., torch.Tensor], kv_caches: list[torch.Tensor], block_size: int,
                 device: torch.device, graphs: CUDAGraphRunner | None = None,
                 backend: AttentionBackend | None = None, verify_graphs: Sequence[CUDAGraphRunner] = (),
                 mixed_graphs: MixedGraphRunner | None = None):
        self.step, self.graphs = step, graphs
        self.mixed_graphs = mixed_graphs  # steps with prompt tokens (cudagraph_mode FULL)
        # speculative decoding's verify steps, ascending in tokens a sequence (setup.verify_sizes): up to k + 1
        self.verify_graphs = tuple(verify_graphs)
        self.kv_caches = kv_caches  # per layer [2, num_blocks, block_size, Hkv, D]
        self.block_size, self.device = block_size, device
        self.backend = backend or TorchBackend()

    @torch.inference_mode()
    def execute(self, batch: list[ScheduledSeq], pending_tokens: torch.Tensor | None = None) -> torch.Tensor:
        """Queue the step; returns its logits [N, vocab] (not waited for). pending_tokens: the tokens
        of the step in flight, where the sequences' PENDING input tokens are read (async scheduling)."""
        host = prepare_step(batch, self.block_size)
        pending = pending_inputs(batch, host)
        assert pending is None or pending_tokens is not None, "pending input tokens without the step that samples them"
        fill = None if pending is None else (lambda input_ids: fill_pending(input_ids, pending, pending_tokens))
        with use_backend(self.backend):
            if self.graphs is not None and self.graphs.can_run(host):
                return self.graphs.run(host, fill)
            if fill is None and (verify := self.verify_graph_for(host)) is not None:
                return verify.run(host)
            if self.mixed_graphs is not None and self.mixed_graphs.can_run(host):
                return self.mixed_graphs.run(host, fill)
            self.backend.plan(host.attention)
            inputs = host.to_device(self.kv_caches, self.device)
            if fill is not None:
                fill(inputs.input_ids)
            return self.step(*inputs.flat())  # [N, vocab]

    def verify_graph_for(self, host) -> CUDAGraphRunner | None:
        """The verify graphs of the fewest tokens a sequence that hold host's step, if any do."""
        return next((verify for verify in self.verify_graphs if verify.can_run(host)), None)

    @torch.inference_mode()
    def execute_decode_steps(self, batch: list[ScheduledSeq], num_steps: int) -> list[list[int]]:
        """`num_steps` greedy decode steps of one batch of decoding sequences, each step's argmax
        fed to the next on the device, read back once: tokens[step][row]. The sequences' blocks
        must already cover num_steps new tokens."""
        first = prepare_step(batch, self.block_size)
        hosts = [first] + [advance(first, j, self.block_size) for j in range(1, num_steps)]
        with use_backend(self.backend):
            if self.graphs is not None and self.graphs.can_run(first):
                return self.graphs.run_steps(hosts).tolist()
            tokens = []
            for host in hosts:
                self.backend.plan(host.attention)
                inputs = host.to_device(self.kv_caches, self.device)
                if tokens:
                    inputs.input_ids.copy_(tokens[-1])
                tokens.append(self.step(*inputs.flat()).argmax(dim=-1))
            return torch.stack(tokens).tolist()
