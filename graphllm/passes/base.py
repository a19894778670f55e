"""GraphPass: the shape every pass has.

A pass is one class in one file: a docstring showing the graph before and after, a stable
`name`, a `version`, a `uuid()` that hashes its source file (so editing a pass invalidates
artifacts compiled with it), and `apply(graph) -> counts` that rewrites the StepGraph (graph
and weights together) and says what it changed, e.g. {"fused": 2}. `devices` names the device
types whose graphs the pass is for (None: all); the pass manager skips it on other graphs, and
calling a pass directly applies it whatever the device (tests do, on CPU).
"""

import functools
import hashlib
import inspect
import sys
from typing import ClassVar

import torch

from graphllm.ir.graph import StepGraph


@functools.cache
def source_uuid(module: str, salt: str) -> str:
    """Hash of a module's source as loaded by this process (read once, so edits made on disk
    while a process runs do not change the keys it computes)."""
    source = inspect.getsource(sys.modules[module])
    return hashlib.sha256(f"{salt}:{source}".encode()).hexdigest()[:16]


class GraphPass:
    name: ClassVar[str]
    version: ClassVar[int] = 1
    devices: ClassVar[tuple[str, ...] | None] = None

    def runs_on(self, device: torch.device) -> bool:
        return self.devices is None or device.type in self.devices

    def uuid(self) -> str:
        return source_uuid(type(self).__module__, f"{self.name}:{self.version}")

    def apply(self, graph: StepGraph) -> dict[str, int]:
        raise NotImplementedError

    def __call__(self, graph: StepGraph) -> dict[str, int]:
        counts = self.apply(graph)
        graph.recompile()
        return counts
