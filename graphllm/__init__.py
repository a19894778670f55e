"""graphllm: serve LLMs from a compiled graph.

The public API (`Engine`, `EngineConfig`, `SamplingParams`, `RequestOutput`, `CompletionOutput`)
is loaded on first use, so importing one room of the package (`graphllm.kernels.store_kv`, say)
does not pull in the runtime above it.
"""

import importlib

from graphllm.version import __version__

_EXPORTS = {"CompletionOutput": "graphllm.runtime.outputs", "Engine": "graphllm.runtime.engine",
            "EngineConfig": "graphllm.config", "RequestOutput": "graphllm.runtime.outputs",
            "SamplingParams": "graphllm.runtime.sampling_params"}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'graphllm' has no attribute {name!r}")
