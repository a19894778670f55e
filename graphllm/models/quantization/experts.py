"""A pre-quantized checkpoint's MoE experts -> the stacked float8 experts that graphllm.fused_moe_fp8 runs.

Published FP8 MoE checkpoints (compressed-tensors, e.g. Qwen3-30B-A3B-FP8-dynamic; AutoFP8's Mixtral) store one
fp8 linear per expert and projection, each in the layout of a dense one (convert.py):

    <experts>.{e}.<gate|up|down>.weight        float8_e4m3fn [N, K]
    <experts>.{e}.<gate|up|down>.weight_scale  [N, 1] / [N] (channel) or [] / [1] (tensor)
    <experts>.{e}.<gate|up|down>.input_scale   [] / [1] (static activations only)

Each lands where its float twin would (MoeExperts.checkpoint_parts, models/moe.py), in the stacks

    <experts>.gate_up_proj: {"qweight": f8e4m3fn [E, 2I, H], "weight_scale": f32 [E, 2I]}
    <experts>.down_proj:    {"qweight": f8e4m3fn [E, H, I],  "weight_scale": f32 [E, H]}

with one scale per output row: a per-tensor scale is repeated over its linear's rows, so an expert's gate and
up may have scales of their own. The float8 experts are weight-only (activations stay in the model dtype): an
activation scheme is accepted, its static scales checked and dropped, and one log line says so.

A layer's experts are quantized unless the ignore list names them; refused by name: a layer whose experts are
partly quantized (one op runs them all) and a quantized router (the op takes float router logits).
"""

import logging
from typing import NamedTuple

import torch
from torch import nn

from graphllm.kernels.quant_layout import FP8_DTYPE
from graphllm.models.checkpoint_parts import CheckpointPart
from graphllm.models.errors import ModelLoadError
from graphllm.models.moe import MoeExperts
from graphllm.models.quantization.convert import convert_linear
from graphllm.models.quantization.scheme import CheckpointQuantization

ROUTER = "gate"  # the router linear beside an MoE block's experts (models/moe.py SparseMoeBlock.gate)
log = logging.getLogger(__name__)


class ExpertLinear(NamedTuple):
    """One expert's stored linear: where it lands in its stack, its [N, K], and the stack's [E, rows, K]."""
    part: CheckpointPart
    shape: tuple[int, int]
    stack: tuple[int, int, int]


def quantized_experts(model: nn.Module, quant: CheckpointQuantization) -> dict[str, ExpertLinear]:
    """Per-expert linear path ("model.layers.0.mlp.experts.3.up_proj") -> its ExpertLinear, over every MoE layer
    whose experts the checkpoint quantizes; a partly quantized layer or a quantized router is refused."""
    out = {}
    for prefix, module in model.named_modules():
        if not isinstance(module, MoeExperts):
            continue
        check_router_ignored(model, prefix.rpartition(".")[0], quant)
        linears = {name.removesuffix(".weight"): part for name, part in module.checkpoint_parts(prefix).items()}
        quantized = [p for p in linears if not quant.ignored(p)]
        if not quantized:
            continue
        if len(quantized) < len(linears):
            plain = next(p for p in linears if quant.ignored(p))
            raise ModelLoadError(f"config.json quantization_config: the experts of {prefix!r} are partly quantized "
                                 f"({quantized[0]!r} is, {plain!r} is in ignore): the fused MoE runs a layer's "
                                 "experts all in float8 or all in the model dtype")
        for name, part in linears.items():
            stack = model.get_parameter(part.parameter)  # built on the meta device: shapes only
            out[name] = ExpertLinear(part, tuple(stack[part.index].shape), tuple(stack.shape))
    return out


def check_router_ignored(model: nn.Module, block: str, quant: CheckpointQuantization) -> None:
    """The router beside the experts (the linear `gate` of their block) must be in ignore."""
    router = f"{block}.{ROUTER}" if block else ROUTER
    if isinstance(getattr(model.get_submodule(block), ROUTER, None), nn.Linear) and not quant.ignored(router):
        raise ModelLoadError(f"config.json quantization_config: the MoE router {router!r} is quantized (not in "
                             "ignore): graphllm keeps routers in the model dtype (the fused MoE takes float router "
                             "logits); quantize with the routers in ignore (e.g. \"re:.*mlp[.]gate$\")")


def stack_experts(quant: CheckpointQuantization, experts: dict[str, ExpertLinear],
                  by_linear: dict[str, dict[str, torch.Tensor]], dtype: torch.dtype,
                  device: torch.device) -> dict[str, dict[str, torch.Tensor]]:
    """Stack path ("model.layers.0.mlp.experts.gate_up_proj") -> {"qweight", "weight_scale"} on `device`, from each
    expert linear's stored tensors (by_linear: linear path -> {suffix: tensor}), every tensor checked and named."""
    stacks: dict[str, dict[str, torch.Tensor]] = {}
    for prefix, (part, shape, stack) in experts.items():
        converted = convert_linear(quant, prefix, by_linear.get(prefix, {}), shape, dtype)  # input_scale dropped
        if part.parameter not in stacks:
            stacks[part.parameter] = {"qweight": torch.empty(stack, dtype=FP8_DTYPE),
                                      "weight_scale": torch.empty(stack[:2], dtype=torch.float32)}
        stacks[part.parameter]["qweight"][part.index] = converted["qweight"]  # [N, K]
        stacks[part.parameter]["weight_scale"][part.index] = converted["weight_scale"]  # [N]
    if experts:
        how = "per token" if quant.input_dynamic else "with static input scales (dropped for the experts)"
        log.warning("MoE experts: weight-only float8 (graphllm.fused_moe_fp8), their activations stay in %s where "
                    "the checkpoint quantizes them to fp8 %s; its dense linears run W8A8 as stored",
                    str(dtype).removeprefix("torch."), how)
    return {name: {key: t.to(device) for key, t in stack.items()} for name, stack in stacks.items()}

