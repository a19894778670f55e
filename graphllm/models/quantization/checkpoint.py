"""Which checkpoint tensors belong to quantized linears, quantized MoE experts and KV-cache scales, and their
conversion.

The loader reads every tensor of the folder once; the names `QuantizedTensors.claims` accepts come
here instead of into the model's parameters: `<linear>.<suffix>` for each quantized linear and each quantized
expert's linear (`<experts>.{e}.<proj>`: experts.py; the suffixes of its method, convert.py) and the per-layer
KV-cache scales (`model.layers.<i>.self_attn.k_scale` / `v_scale`, or the older `k_proj.output_scale` /
`v_proj.output_scale`).
"""

import re

import torch
from torch import nn

from graphllm.models.errors import ModelLoadError
from graphllm.models.quantization.convert import FLOAT_DTYPES, check_scale_values, convert_linear, linear_tensor_names
from graphllm.models.quantization.experts import ExpertLinear, stack_experts
from graphllm.models.quantization.scheme import CheckpointQuantization

KV_SCALE = re.compile(r"model\.layers\.(\d+)\.self_attn\.(?:([kv])_scale|([kv])_proj\.output_scale)")
UNQUANTIZED_HEAD = "lm_head"  # the logits projection stays in the model dtype (as vLLM does for these methods)


def quantized_linears(model: nn.Module, quant: CheckpointQuantization) -> dict[str, tuple[int, int]]:
    """Module path -> (N, K) of every linear stored quantized: each nn.Linear but lm_head and the ignored
    (an MoE router among them is refused by experts.quantized_experts)."""
    return {name: (module.out_features, module.in_features) for name, module in model.named_modules()
            if isinstance(module, nn.Linear) and name != UNQUANTIZED_HEAD and not quant.ignored(name)}


class QuantizedTensors:
    """Routes a quantized checkpoint's tensors: `claims(name)` says whether this class takes the tensor."""

    def __init__(self, quant: CheckpointQuantization, linears: dict[str, tuple[int, int]],
                 experts: dict[str, ExpertLinear] | None = None):
        self.quant, self.linears, self.experts = quant, linears, experts or {}
        self.suffixes = set(linear_tensor_names(quant))

    def claims(self, name: str) -> bool:
        prefix, _, suffix = name.rpartition(".")
        if prefix == UNQUANTIZED_HEAD and suffix in self.suffixes - {"weight"}:
            raise ModelLoadError(f"the checkpoint quantizes lm_head (tensor {name!r}): graphllm keeps lm_head "
                                 "unquantized; add it to the quantization config's ignore list when quantizing")
        if suffix in self.suffixes - {"weight"} and prefix not in self.linears and self.quant.ignored(prefix):
            raise ModelLoadError(f"tensor {name!r} is stored quantized, but config.json's quantization_config keeps "
                                 f"{prefix!r} unquantized (ignore / ignored_layers / modules_to_not_convert / "
                                 "modules_in_block_to_quantize): the config and the weights disagree")
        return bool(KV_SCALE.fullmatch(name)) or (
            (prefix in self.linears or prefix in self.experts) and suffix in self.suffixes)

    def convert(self, claimed: dict[str, torch.Tensor], dtype: torch.dtype,
                device: torch.device) -> dict[str, dict[str, torch.Tensor]]:
        """Every quantized linear's internal-layout tensors (graphllm/kernels/quant_layout.py), on `device`."""
        return {prefix: {key: t.to(device) for key, t in
                         convert_linear(self.quant, prefix, tensors, self.linears[prefix], dtype).items()}
                for prefix, tensors in by_linear(claimed, self.linears).items()}

    def convert_experts(self, claimed: dict[str, torch.Tensor], dtype: torch.dtype,
                        device: torch.device) -> dict[str, dict[str, torch.Tensor]]:
        """Every quantized expert stack ("<experts>.gate_up_proj" / ".down_proj") -> {"qweight", "weight_scale"}."""
        return stack_experts(self.quant, self.experts, by_linear(claimed, self.experts), dtype, device)

    def kv_scales(self, claimed: dict[str, torch.Tensor], num_layers: int) -> dict[int, tuple[float, float]]:
        """Layer -> (k_scale, v_scale); every layer must have both when the config declares an fp8 KV cache or
        any layer has one (the engine binds one pair to each layer's cache)."""
        found: dict[int, dict[str, float]] = {}
        for name, tensor in claimed.items():
            match = KV_SCALE.fullmatch(name)
            if match and int(match[1]) >= num_layers:
                raise ModelLoadError(f"unexpected tensor {name!r}: the model has {num_layers} layers")
            if match:
                found.setdefault(int(match[1]), {})[match[2] or match[3]] = scalar_scale(name, tensor)
        layers = range(num_layers) if self.quant.kv_cache_fp8 or found else ()
        for layer in layers:
            for kv in "kv":
                if kv not in found.get(layer, {}):
                    why = ("the config declares an fp8 KV cache" if self.quant.kv_cache_fp8
                           else f"layer {min(found)} has its scales, and each layer needs its own")
                    raise ModelLoadError(f"checkpoint is missing tensor 'model.layers.{layer}.self_attn.{kv}_scale' "
                                         f"(the fp8 KV-cache scale of that layer; {why})")
        return {layer: (found[layer]["k"], found[layer]["v"]) for layer in layers}


def by_linear(claimed: dict[str, torch.Tensor], prefixes) -> dict[str, dict[str, torch.Tensor]]:
    """Linear path -> {suffix: tensor} over `prefixes` (each present, maybe empty), KV-cache scales left out."""
    out: dict[str, dict[str, torch.Tensor]] = {prefix: {} for prefix in prefixes}
    for name, tensor in claimed.items():
        prefix, _, suffix = name.rpartition(".")
        if prefix in out and not KV_SCALE.fullmatch(name):
            out[prefix][suffix] = tensor
    return out


def scalar_scale(name: str, tensor: torch.Tensor) -> float:
    if tensor.numel() != 1 or tensor.dtype not in FLOAT_DTYPES:
        raise ModelLoadError(f"tensor {name!r} has shape {tuple(tensor.shape)} and dtype {tensor.dtype}, "
                             "expected one float32/float16/bfloat16 scale")
    check_scale_values(name, tensor, positive=True)  # the KV cache divides by it
    return float(tensor.float().reshape(()))
