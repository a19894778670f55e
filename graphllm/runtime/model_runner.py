"""Runs one scheduled batch through the step: flat inputs in, logits of sampled rows out.

The step is any callable over the flat tensors of StepInputs (graphllm.ir.STEP_INPUT_NAMES):
the eager StepModule, or the compiled AOTInductor package. That seam is the whole difference
between the eager and compiled engines.
"""

from typing import Callable

import torch

from graphllm.runtime.cudagraphs import CUDAGraphRunner
from graphllm.runtime.inputs import prepare_step
from graphllm.runtime.scheduler import ScheduledSeq


class ModelRunner:
    def __init__(self, step: Callable[..., torch.Tensor], kv_caches: list[torch.Tensor], block_size: int,
                 device: torch.device, graphs: CUDAGraphRunner | None = None):
        self.step, self.graphs = step, graphs
        self.kv_caches = kv_caches  # per layer [2, num_blocks, block_size, Hkv, D]
        self.block_size, self.device = block_size, device

    @torch.inference_mode()
    def execute(self, batch: list[ScheduledSeq]) -> torch.Tensor:
        inputs = prepare_step(batch, self.kv_caches, self.block_size, self.device)
        if self.graphs is not None and self.graphs.can_run(inputs):
            return self.graphs.run(inputs)
        return self.step(*inputs.flat())  # [N, vocab]
