"""Runs one scheduled batch through the model: flat inputs in, logits of sampled rows out.

The step callable is the seam where the compiler (and CUDA graphs) plug in: it takes only
the flat tensors of StepInputs and returns logits, so eager and compiled runs are one path.
"""

import torch
from torch import nn

from graphllm.runtime.inputs import StepInputs, prepare_step
from graphllm.runtime.scheduler import ScheduledSeq


class ModelRunner:
    def __init__(self, model: nn.Module, kv_caches: list[torch.Tensor], block_size: int,
                 device: torch.device):
        self.model, self.kv_caches = model, kv_caches  # kv_caches: per layer [2, blocks, block_size, Hkv, D]
        self.block_size, self.device = block_size, device

    def step_fn(self, inputs: StepInputs) -> torch.Tensor:
        hidden = self.model(inputs.input_ids, inputs.positions, inputs.meta)  # [T, hidden]
        return self.model.compute_logits(hidden[inputs.logits_indices])  # [N, vocab]

    @torch.inference_mode()
    def execute(self, batch: list[ScheduledSeq]) -> torch.Tensor:
        inputs = prepare_step(batch, self.kv_caches, self.block_size, self.device)
        return self.step_fn(inputs)
