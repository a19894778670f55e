"""CheckpointQuantization: how a pre-quantized checkpoint stores its linear weights.

Parsed once from config.json (parse.py) and frozen; the loader and the compiler's quantization pass
read it. `scheme` names graphllm's internal layout (graphllm/kernels/quant_layout.py) that every
quantized linear is converted to; `method` and `format` name the layout on disk.
"""

import re
from dataclasses import dataclass

METHODS = ("compressed-tensors", "gptq", "awq", "fp8")
SCHEMES = ("fp8", "int4")


@dataclass(frozen=True)
class CheckpointQuantization:
    method: str  # "compressed-tensors" | "gptq" | "awq" | "fp8" (AutoFP8 / vLLM per-tensor fp8)
    scheme: str  # "fp8" | "int4": the internal layout the linears are converted to
    format: str  # on disk: "float-quantized" | "naive-quantized" | "pack-quantized" (compressed-tensors),
    #              "gptq" | "gptq_v2" (gptq), "gemm" (awq), "fp8" (fp8)
    group_size: int | None = None  # int4: input columns per scale; None = one group per output channel (G = K)
    symmetric: bool = True  # int4: no stored zero point (GPTQ and AWQ store one either way)
    input_dynamic: bool = True  # fp8: activations scaled per token; False = a static input_scale per linear
    weight_per_tensor: bool = False  # fp8: one stored weight scale per linear (expanded to [N] on load)
    act_order: bool = False  # a g_idx may be stored; loaded only where it is the trivial k // G
    kv_cache_fp8: bool = False  # every layer stores fp8 KV-cache scales (self_attn.k_scale, v_scale)
    ignore: tuple[str, ...] = ()  # linears kept unquantized: module paths, or "re:<regex>" (re.match)

    def __post_init__(self):
        if self.method not in METHODS or self.scheme not in SCHEMES:
            raise ValueError(f"unknown quantization method/scheme {self.method!r}/{self.scheme!r}")

    def ignored(self, prefix: str) -> bool:
        """Whether the linear at module path `prefix` (e.g. "model.layers.0.mlp.up_proj") stays unquantized."""
        return any(matches_target(prefix, target) for target in self.ignore)


def matches_target(name: str, target: str) -> bool:
    """compressed-tensors' name match (compressed_tensors/utils/match.py, match_name): "re:" + a regex
    matched at the start of the name, else the exact name."""
    if target.startswith("re:"):
        return re.match(target.removeprefix("re:"), name) is not None
    return target == name
