"""Pre-quantized Hugging Face checkpoints (compressed-tensors, GPTQ, AWQ, fp8) read into graphllm's
internal quantized layouts (graphllm/kernels/quant_layout.py).

    parse.py       config.json quantization_config -> CheckpointQuantization, or an error naming the option
    scheme.py      CheckpointQuantization (frozen): method, scheme ("fp8" | "int4"), group size, ignore list
    convert.py     one linear's stored tensors -> its internal layout, every tensor checked and named
    experts.py     which MoE experts are stored quantized (fp8, one linear per expert); their float8 stacks
    checkpoint.py  which tensors of a folder are quantized linears, experts or KV-cache scales; their conversion

The loader (graphllm/models/loader.py, load_checkpoint) is the only caller; the compiler's
quantization passes (quantize_fp8 / quantize_int4, quantize_fp8_experts) consume what it returns.
"""

from graphllm.models.quantization.checkpoint import QuantizedTensors, quantized_linears
from graphllm.models.quantization.convert import convert_linear, linear_tensor_names
from graphllm.models.quantization.experts import quantized_experts
from graphllm.models.quantization.parse import read_checkpoint_quantization
from graphllm.models.quantization.scheme import CheckpointQuantization

__all__ = ["CheckpointQuantization", "QuantizedTensors", "convert_linear", "linear_tensor_names",
           "quantized_experts", "quantized_linears", "read_checkpoint_quantization"]
