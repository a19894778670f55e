"""GraphPass: the shape every pass has.

A pass is one class in one file: a docstring showing the graph before and after, a stable
`name`, a `version`, a `uuid()` that hashes its source file (so editing a pass invalidates
artifacts compiled with it), and `apply(graph) -> counts` that rewrites the StepGraph (graph
and weights together) and says what it changed, e.g. {"fused": 2}.
"""

import hashlib
import inspect
import sys
from typing import ClassVar

from graphllm.ir.graph import StepGraph


class GraphPass:
    name: ClassVar[str]
    version: ClassVar[int] = 1

    def uuid(self) -> str:
        source = inspect.getsource(sys.modules[type(self).__module__])
        return hashlib.sha256(f"{self.name}:{self.version}:{source}".encode()).hexdigest()[:16]

    def apply(self, graph: StepGraph) -> dict[str, int]:
        raise NotImplementedError

    def __call__(self, graph: StepGraph) -> dict[str, int]:
        counts = self.apply(graph)
        graph.recompile()
        return counts
