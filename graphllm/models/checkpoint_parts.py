"""Parameters that the checkpoint stores in parts: a stacked MoE expert weight [E, 2I, H] is published as
one linear per expert and projection (`experts.{e}.w1.weight` ...). A module that stacks them declares
`checkpoint_parts(prefix) -> {checkpoint name: CheckpointPart}`; the loader (graphllm/models/loader.py)
assembles each such parameter from its parts as the files are read, or takes it whole when the checkpoint
stores it under the module's own name. A part missing, misshaped or given twice is an error naming it.
"""

from pathlib import Path
from typing import NamedTuple

import torch
from torch import nn

from graphllm.models.errors import ModelLoadError


class CheckpointPart(NamedTuple):
    """A checkpoint tensor that fills `parameter[index]` (e.g. index (e, slice(0, I)): expert e's gate rows)."""
    parameter: str
    index: tuple


def checkpoint_parts(model: nn.Module) -> dict[str, CheckpointPart]:
    """{checkpoint name: its part} over every module of `model` that declares checkpoint_parts."""
    parts = {}
    for prefix, module in model.named_modules():
        if hasattr(module, "checkpoint_parts"):
            parts.update(module.checkpoint_parts(prefix))
    return parts


def split_into_parts(tensors: dict[str, torch.Tensor], parts: dict[str, CheckpointPart]) -> dict[str, torch.Tensor]:
    """The checkpoint layout of a state dict in the module's layout: each stacked parameter as its parts."""
    stacked = {part.parameter for part in parts.values()}
    out = {name: t for name, t in tensors.items() if name not in stacked}
    out.update({name: tensors[part.parameter][part.index].contiguous() for name, part in parts.items()})
    return out


class StackedTensors:
    """Assembles the stacked parameters (in `dtype` on `device`) from their parts as they are read."""

    def __init__(self, parts: dict[str, CheckpointPart], expected: dict[str, nn.Parameter], dtype: torch.dtype,
                 device: torch.device):
        self.parts, self.expected, self.dtype, self.device = parts, expected, dtype, device
        self.filled: dict[str, torch.Tensor] = {}
        self.seen: set[str] = set()

    def claims(self, name: str) -> bool:
        return name in self.parts

    def put(self, name: str, tensor: torch.Tensor, file: Path) -> None:
        part = self.parts[name]
        if part.parameter not in self.filled:
            shape = self.expected[part.parameter].shape
            self.filled[part.parameter] = torch.empty(shape, dtype=self.dtype, device=self.device)
        target = self.filled[part.parameter][part.index]
        if tensor.shape != target.shape:
            raise ModelLoadError(f"tensor {name!r} in {file.name} has shape {tuple(tensor.shape)}, the model expects "
                                 f"{tuple(target.shape)} (a part of {part.parameter})")
        if name in self.seen:
            raise ModelLoadError(f"tensor {name!r} appears twice in the checkpoint")
        if not tensor.is_floating_point():
            raise ModelLoadError(f"tensor {name!r} in {file.name} is stored as {tensor.dtype}, expected a "
                                 "floating-point expert weight: the checkpoint's quantization config (if any) "
                                 "does not quantize it")
        target.copy_(tensor)
        self.seen.add(name)

    def finish(self, read_whole: set[str]) -> dict[str, torch.Tensor]:
        """The assembled parameters; a parameter neither read whole nor given every part names what is missing."""
        missing = sorted(name for name, part in self.parts.items()
                         if name not in self.seen and part.parameter not in read_whole)
        if missing:
            raise ModelLoadError(f"checkpoint is missing tensor(s): {', '.join(missing[:10])}"
                                 + (f" and {len(missing) - 10} more" if len(missing) > 10 else ""))
        both = sorted(set(self.filled) & read_whole)
        if both:
            raise ModelLoadError(f"checkpoint stores {both[0]} both whole and as per-expert parts")
        return self.filled
