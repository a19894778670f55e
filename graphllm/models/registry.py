"""config.json `architectures[0]` -> (module class, ModelConfig).

Each entry turns the Hugging Face config dict into a ModelConfig with that architecture's
flags; the module class is shared when the difference is only a flag.
"""

from typing import Any, Callable

from torch import nn

from graphllm.models.config import ModelConfig, model_config_from_hf
from graphllm.models.llama import LlamaForCausalLM
from graphllm.models.olmo2 import Olmo2ForCausalLM
from graphllm.models.phi3 import Phi3ForCausalLM


def _reject(hf: dict[str, Any], key: str, why: str) -> None:
    if hf.get(key):
        raise ValueError(f"config.json sets {key}={hf[key]!r}: {why} is not supported yet")


def _llama(hf: dict[str, Any], arch: str) -> ModelConfig:
    _reject(hf, "mlp_bias", "a bias on the MLP projections")
    return model_config_from_hf(hf, arch, attention_bias=bool(hf.get("attention_bias", False)))


def _mistral(hf: dict[str, Any], arch: str) -> ModelConfig:
    return model_config_from_hf(hf, arch, attention_bias=bool(hf.get("attention_bias", False)),
                                sliding_window=int(hf.get("sliding_window") or 0))


def _qwen2(hf: dict[str, Any], arch: str) -> ModelConfig:
    _reject(hf, "use_sliding_window", "Qwen2's per-layer sliding window")
    return model_config_from_hf(hf, arch, attention_bias=True)


def _qwen3(hf: dict[str, Any], arch: str) -> ModelConfig:
    _reject(hf, "use_sliding_window", "Qwen3's per-layer sliding window")
    return model_config_from_hf(hf, arch, attention_bias=bool(hf.get("attention_bias", False)),
                                qk_norm=True)


def _olmo2(hf: dict[str, Any], arch: str) -> ModelConfig:
    _reject(hf, "attention_bias", "a bias on the attention projections")
    return model_config_from_hf(hf, arch, qk_norm_whole=True)


def _phi3(hf: dict[str, Any], arch: str) -> ModelConfig:
    if float(hf.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ValueError(f"config.json sets partial_rotary_factor={hf['partial_rotary_factor']!r}: rope over part "
                         "of each head is not supported yet")
    _reject(hf, "attention_bias", "a bias on the q/k/v projection")
    return model_config_from_hf(hf, arch, sliding_window=int(hf.get("sliding_window") or 0), fused_qkv_gate_up=True)


ConfigBuilder = Callable[[dict[str, Any], str], ModelConfig]

ARCHITECTURES: dict[str, tuple[type[nn.Module], ConfigBuilder]] = {
    "LlamaForCausalLM": (LlamaForCausalLM, _llama),
    "MistralForCausalLM": (LlamaForCausalLM, _mistral),
    "Qwen2ForCausalLM": (LlamaForCausalLM, _qwen2),
    "Qwen3ForCausalLM": (LlamaForCausalLM, _qwen3),
    "Olmo2ForCausalLM": (Olmo2ForCausalLM, _olmo2),
    "Phi3ForCausalLM": (Phi3ForCausalLM, _phi3),
}


# config.json fields that change the math in families we do not build yet (Gemma's soft-caps and query
# scale, Granite's multipliers, partial rope): a config that sets one is refused by name, never run
# without it. Phi-3 reads partial_rotary_factor itself (its builder refuses anything but 1.0).
MATH_FIELDS = {"attn_logit_softcapping": None, "final_logit_softcapping": None, "query_pre_attn_scalar": None,
               "embedding_multiplier": 1.0, "residual_multiplier": 1.0, "attention_multiplier": None,
               "logits_scaling": 1.0, "partial_rotary_factor": 1.0}


def _reject_math_fields(hf: dict[str, Any], arch: str) -> None:
    for key, neutral in MATH_FIELDS.items():
        if hf.get(key) is not None and hf[key] != neutral:
            raise ValueError(f"config.json sets {key}={hf[key]!r}, which changes the math of {arch} in a way "
                             "graphllm does not implement: refused rather than run without it")


def resolve_architecture(hf: dict[str, Any]) -> tuple[type[nn.Module], ModelConfig]:
    """The module class and ModelConfig for a Hugging Face config dict (MATH_FIELDS refused by name)."""
    archs = hf.get("architectures") or []
    if not archs:
        raise ValueError("config.json has no 'architectures' entry; cannot tell which model to build")
    arch = archs[0]
    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {arch!r}; supported: {', '.join(sorted(ARCHITECTURES))}")
    module_cls, build_config = ARCHITECTURES[arch]
    config = build_config(hf, arch)
    _reject_math_fields(hf, arch)
    return module_cls, config
