"""Runs one scheduled batch through the step: flat inputs in, logits of sampled rows out.

The step is any callable over the flat tensors of StepInputs (graphllm.ir.STEP_INPUT_NAMES):
the eager StepModule, or the compiled artifact. That seam is the whole difference between the
eager and compiled engines. The attention backend is planned here, on the host, before the step
(CUDAGraphRunner plans it for the bucket it replays), and is active only during the step.
"""

from typing import Callable

import torch

from graphllm.ops.backends import AttentionBackend, TorchBackend, use_backend
from graphllm.runtime.cudagraphs import CUDAGraphRunner
from graphllm.runtime.inputs import prepare_step
from graphllm.runtime.scheduler import ScheduledSeq


class ModelRunner:
    def __init__(self, step: Callable[..., torch.Tensor], kv_caches: list[torch.Tensor], block_size: int,
                 device: torch.device, graphs: CUDAGraphRunner | None = None,
                 backend: AttentionBackend | None = None):
        self.step, self.graphs = step, graphs
        self.kv_caches = kv_caches  # per layer [2, num_blocks, block_size, Hkv, D]
        self.block_size, self.device = block_size, device
        self.backend = backend or TorchBackend()

    @torch.inference_mode()
    def execute(self, batch: list[ScheduledSeq]) -> torch.Tensor:
        host = prepare_step(batch, self.block_size)
        with use_backend(self.backend):
            if self.graphs is not None and self.graphs.can_run(host):
                return self.graphs.run(host)
            self.backend.plan(host.attention)
            return self.step(*host.to_device(self.kv_caches, self.device).flat())  # [N, vocab]
