"""config.json -> ModelConfig for Gemma 2 and Gemma 3 (text): the registry's builders for models/gemma.py.

A key missing from config.json takes transformers 5's default (Gemma2Config, Gemma3TextConfig): those
defaults change the math (head_dim 256, Gemma 2's soft caps 50 and 30, Gemma 3's rope bases), so they
are spelled out here rather than left to model_config_from_hf's Llama defaults. A key present as null
means off. What graphllm's Gemma does not do is refused by name.
"""

from dataclasses import replace
from typing import Any

from graphllm.models.config import ModelConfig, RopeConfig, model_config_from_hf, rope_from_hf

LAYER_TYPES = ("sliding_attention", "full_attention")
ACTIVATION = "gelu_pytorch_tanh"  # gelu with the tanh approximation: GemmaMLP's
COMMON_DEFAULTS = dict(head_dim=256, query_pre_attn_scalar=256, sliding_window=4096, rms_norm_eps=1e-6,
                       tie_word_embeddings=True, hidden_activation=ACTIVATION)
GEMMA2_DEFAULTS = dict(COMMON_DEFAULTS, attn_logit_softcapping=50.0, final_logit_softcapping=30.0, rope_theta=10000.0)
GEMMA3_DEFAULTS = dict(COMMON_DEFAULTS, attn_logit_softcapping=None, final_logit_softcapping=None,
                       rope_theta=1_000_000.0, rope_local_base_freq=10_000.0, sliding_window_pattern=6)


def _refuse(hf: dict[str, Any], key: str, why: str) -> None:
    if hf.get(key):
        raise ValueError(f"config.json sets {key}={hf[key]!r}: {why} is not supported yet")


def layer_types(hf: dict[str, Any], pattern: int) -> tuple[str, ...]:
    """config.json's layer_types, else transformers' default: layer i slides unless (i + 1) % pattern == 0."""
    n = hf["num_hidden_layers"]
    types = hf.get("layer_types") or ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
                                      for i in range(n)]
    if len(types) != n or not set(types) <= set(LAYER_TYPES):
        raise ValueError(f"config.json's layer_types {types!r}: expected {n} entries of {LAYER_TYPES}")
    return tuple(types)


def _common(hf: dict[str, Any], arch: str, pattern: int) -> dict[str, Any]:
    """The ModelConfig fields Gemma 2 and 3 read alike (hf holds the defaults already)."""
    _refuse(hf, "attention_bias", "a bias on Gemma's attention projections")
    _refuse(hf, "use_bidirectional_attention", "bidirectional attention")
    if hf["hidden_activation"] != ACTIVATION:
        raise ValueError(f"config.json sets hidden_activation={hf['hidden_activation']!r}: {arch}'s MLP runs "
                         f"{ACTIVATION} only")
    types = layer_types(hf, pattern)
    window = int(hf.get("sliding_window") or 0)
    if "sliding_attention" in types and window <= 0:
        raise ValueError(f"config.json has sliding-window layers but sliding_window={hf.get('sliding_window')!r}")
    return dict(layer_types=types, sliding_window=window, query_pre_attn_scalar=float(hf["query_pre_attn_scalar"]),
                final_logit_softcapping=float(hf.get("final_logit_softcapping") or 0.0))


def gemma2_config(hf: dict[str, Any], arch: str) -> ModelConfig:
    hf = {**GEMMA2_DEFAULTS, **hf}
    return model_config_from_hf(hf, arch, **_common(hf, arch, pattern=2),  # Gemma 2 ignores sliding_window_pattern
                                attn_logit_softcapping=float(hf.get("attn_logit_softcapping") or 0.0))


def gemma3_ropes(hf: dict[str, Any]) -> tuple[RopeConfig, RopeConfig]:
    """(global rope, sliding layers' rope): transformers 5's rope_parameters per layer type, or transformers 4's
    rope_theta + rope_scaling (global layers only) and rope_local_base_freq. Unknown scalings are refused."""
    params = hf.get("rope_parameters") or {}
    if "full_attention" in params or "sliding_attention" in params:
        full = {"rope_theta": hf["rope_theta"], **(params.get("full_attention") or {})}
        local = {"rope_theta": hf["rope_local_base_freq"], **(params.get("sliding_attention") or {})}
        return rope_from_hf({"rope_parameters": full}), rope_from_hf({"rope_parameters": local})
    return rope_from_hf(hf), RopeConfig(theta=float(hf["rope_local_base_freq"]))


def gemma3_config(hf: dict[str, Any], arch: str) -> ModelConfig:
    hf = {**GEMMA3_DEFAULTS, **hf}
    if hf.get("attn_logit_softcapping"):  # transformers' Gemma3Attention does not pass it to attention
        raise ValueError(f"config.json sets attn_logit_softcapping={hf['attn_logit_softcapping']!r}: transformers' "
                         f"{arch} ignores it, so what it means is unclear; refused rather than guessed")
    full, local = gemma3_ropes(hf)
    config = model_config_from_hf(hf, arch, **_common(hf, arch, pattern=int(hf["sliding_window_pattern"])),
                                  qk_norm=True, rope_local=local)
    return replace(config, rope=full)  # model_config_from_hf reads one rope; Gemma 3 has one per layer type
