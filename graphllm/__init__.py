"""graphllm: serve LLMs from a compiled graph."""

from graphllm.config import EngineConfig
from graphllm.runtime.engine import Engine
from graphllm.runtime.outputs import CompletionOutput, RequestOutput
from graphllm.runtime.sampling_params import SamplingParams

__all__ = ["CompletionOutput", "Engine", "EngineConfig", "RequestOutput", "SamplingParams"]
__version__ = "0.1.0"
