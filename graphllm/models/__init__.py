"""Plain PyTorch model definitions, the architecture registry and the safetensors loader.

Nothing in this package imports the runtime, the server or torch.distributed.
"""

from graphllm.models.config import ModelConfig
from graphllm.models.loader import ModelLoadError, load_model
from graphllm.models.registry import ARCHITECTURES, resolve_architecture

__all__ = ["ARCHITECTURES", "ModelConfig", "ModelLoadError", "load_model", "resolve_architecture"]
