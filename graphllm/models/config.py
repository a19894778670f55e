"""ModelConfig: the architecture facts graphllm needs, read from a Hugging Face config.json.

Reads both layouts: transformers 4 (`rope_theta`, `rope_scaling`) and transformers 5
(`rope_parameters`). Only what the model code uses is kept, so the config is frozen and small.

One fact comes from the engine rather than config.json: its max_model_len picks LongRoPE's long or short
factors (fit_max_model_len; models/registry.resolve_architecture applies it).
"""

import math
from dataclasses import dataclass, field, replace
from typing import Any


@dataclass(frozen=True)
class RopeConfig:
    theta: float = 10000.0
    # "default" | "llama3" | "linear" (inv_freq / factor: Gemma 3's global layers) | "yarn" | "longrope"
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    # yarn (DeepSeek-V2's rope_scaling; accepted only where a family asks for it: models/deepseek_v2.py)
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 0.0
    mscale_all_dim: float = 0.0
    truncate: bool = True
    # longrope (Phi-3's 128k models; accepted only where a family asks for it: models/registry._phi3): inv_freq
    # divided per frequency by the long or the short factors ([head_dim / 2] each), cos and sin multiplied by
    # attention_factor. use_long_factor is the engine's choice, not config.json's: fit_max_model_len
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()
    use_long_factor: bool = False
    attention_factor: float = 1.0

    @property
    def ext_factors(self) -> tuple[float, ...]:
        """longrope's divisors of inv_freq, one per frequency: the factors chosen for every position."""
        return self.long_factor if self.use_long_factor else self.short_factor


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope: RopeConfig = field(default_factory=RopeConfig)
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # bias on q/k/v projections (Qwen2: always)
    qk_norm: bool = False  # per-head RMSNorm on q and k (Qwen3)
    qk_norm_whole: bool = False  # RMSNorm over the whole q and k projections, all heads at once (OLMo 2)
    fused_qkv_gate_up: bool = False  # q/k/v in one qkv_proj, gate/up in one gate_up_proj, as stored (Phi-3)
    sliding_window: int = 0  # 0 = full attention
    eos_token_ids: tuple[int, ...] = ()
    # mixture of experts (Mixtral, Qwen3-MoE; graphllm/models/moe.py): 0 experts = a dense model
    num_experts: int = 0  # routed experts per sparse layer
    num_experts_per_tok: int = 0  # top-k experts each token runs
    moe_intermediate_size: int = 0  # each expert's intermediate size (intermediate_size: the dense MLP's)
    norm_topk_prob: bool = False  # renormalise the top-k routing weights to sum to 1 (Mixtral: always)
    sparse_layers: tuple[int, ...] = ()  # the layers whose feed-forward is the MoE block; the rest are dense
    # Gemma 2 / Gemma 3 (graphllm/models/gemma.py)
    layer_types: tuple[str, ...] = ()  # per layer "sliding_attention" | "full_attention"; (): sliding_window everywhere
    rope_local: RopeConfig | None = None  # the sliding layers' own rope (Gemma 3's rope_local_base_freq); None: `rope`
    query_pre_attn_scalar: float = 0.0  # softmax scale query_pre_attn_scalar ** -0.5; 0: head_dim ** -0.5
    attn_logit_softcapping: float = 0.0  # attention scores -> cap * tanh(scores / cap) before the mask; 0: off
    final_logit_softcapping: float = 0.0  # the same on the lm_head logits; 0: off
    # DeepSeek-V2 multi-head latent attention (graphllm/models/deepseek_v2.py); kv_lora_rank 0: not MLA
    kv_lora_rank: int = 0  # the compressed latent c_kv each token caches
    q_lora_rank: int = 0  # 0: q_proj; else q_a_proj -> q_a_layernorm -> q_b_proj
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0  # the decoupled rope key k_pe, one per token, shared by the heads (cached)
    v_head_dim: int = 0
    n_shared_experts: int = 0  # one dense MLP of n_shared_experts * moe_intermediate_size beside the routed ones
    routed_scaling_factor: float = 1.0  # multiplies the routed experts' output

    @property
    def max_positions(self) -> int:
        """The longest sequence this config runs: max_position_embeddings, but original_max_position_embeddings
        where LongRoPE's short factors were chosen (an artifact compiled for a short max_model_len)."""
        if self.rope.rope_type == "longrope" and not self.rope.use_long_factor:
            return min(self.max_position_embeddings, self.rope.original_max_position_embeddings)
        return self.max_position_embeddings

    def window_of(self, layer: int) -> int:
        """Layer `layer`'s sliding window (0: full attention)."""
        if self.layer_types and self.layer_types[layer] != "sliding_attention":
            return 0
        return self.sliding_window

    @property
    def attention_scale(self) -> float:
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    def kv_cache_shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        """One layer's paged cache: [2 (K, V), blocks, block_size, Hkv, D]; with MLA one plane of one "head",
        the latent c_kv and the rope key k_pe side by side: [1, blocks, block_size, 1, kv_lora_rank + rope]."""
        if self.is_mla:
            return (1, num_blocks, block_size, 1, self.kv_lora_rank + self.qk_rope_head_dim)
        return (2, num_blocks, block_size, self.num_key_value_heads, self.head_dim)


SUPPORTED_ROPE_TYPES = ("default", "llama3", "linear")


def rope_from_hf(hf: dict[str, Any], supported: tuple[str, ...] = SUPPORTED_ROPE_TYPES) -> RopeConfig:
    """Rope settings from either `rope_parameters` (v5) or `rope_theta` + `rope_scaling` (v4)."""
    params = dict(hf.get("rope_parameters") or {})
    scaling = hf.get("rope_scaling") or {}
    params = {**scaling, **params}
    theta = params.get("rope_theta", hf.get("rope_theta", 10000.0))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "su":  # the first Phi-3 128k configs' name for longrope (transformers renames it)
        rope_type = "longrope"
    if rope_type not in supported:
        raise ValueError(f"rope type {rope_type!r} is not supported (supported: {supported})")
    if rope_type == "default":
        return RopeConfig(theta=float(theta))
    if rope_type == "yarn":
        return yarn_rope(float(theta), params)
    if rope_type == "longrope":
        return longrope_rope(float(theta), params, hf)
    if rope_type == "linear":
        return RopeConfig(theta=float(theta), rope_type=rope_type, factor=float(params["factor"]))
    return RopeConfig(
        theta=float(theta), rope_type=rope_type, factor=float(params["factor"]),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(params["original_max_position_embeddings"]),
    )


def yarn_rope(theta: float, params: dict[str, Any]) -> RopeConfig:
    """transformers' yarn parameters; an explicit attention_factor (which would replace the mscale ratio) is
    refused by name."""
    if params.get("attention_factor") is not None:
        raise ValueError(f"yarn rope with attention_factor={params['attention_factor']!r} is not supported yet")
    if params.get("factor") is None:
        raise ValueError("yarn rope without a factor is not supported yet")
    return RopeConfig(theta=theta, rope_type="yarn", factor=float(params["factor"]),
                      original_max_position_embeddings=int(params["original_max_position_embeddings"]),
                      beta_fast=float(params.get("beta_fast") or 32), beta_slow=float(params.get("beta_slow") or 1),
                      mscale=float(params.get("mscale") or 0), mscale_all_dim=float(params.get("mscale_all_dim") or 0),
                      truncate=bool(params.get("truncate", True)))


LONGROPE_KEYS = {"rope_type", "type", "rope_theta", "partial_rotary_factor", "short_factor", "long_factor",
                 "original_max_position_embeddings", "factor", "attention_factor"}


def longrope_rope(theta: float, params: dict[str, Any], hf: dict[str, Any]) -> RopeConfig:
    """transformers 5's longrope parameters (modeling_rope_utils._compute_longrope_parameters), short factors
    chosen (fit_max_model_len chooses for the engine). Unknown keys, factor lists of the wrong length and a
    partial rotary factor are refused by name."""
    unknown = sorted(set(params) - LONGROPE_KEYS)
    if unknown:
        raise ValueError(f"longrope rope_scaling sets {', '.join(unknown)}: not a longrope field graphllm knows")
    if float(params.get("partial_rotary_factor") or 1.0) != 1.0:
        raise ValueError(f"longrope with partial_rotary_factor={params['partial_rotary_factor']!r}: rope over part "
                         "of each head is not supported yet")
    half = (hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]) // 2
    short, long = (_longrope_factors(params, name, half) for name in ("short_factor", "long_factor"))
    original = _longrope_original_max(params, hf)
    factor = params.get("factor")  # transformers 5: rope_scaling's factor, else the ratio of the two lengths
    factor = float(factor) if factor is not None else hf.get("max_position_embeddings", 4096) / original
    attention_factor = params.get("attention_factor")
    if attention_factor is None:  # the LongRoPE paper's: sqrt(1 + log(factor) / log(original)), 1 unscaled
        attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    return RopeConfig(theta=theta, rope_type="longrope", factor=factor, original_max_position_embeddings=original,
                      short_factor=short, long_factor=long, attention_factor=float(attention_factor))


def _longrope_factors(params: dict[str, Any], name: str, length: int) -> tuple[float, ...]:
    values = params.get(name)
    if not (isinstance(values, list) and len(values) == length
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)):
        got = f"a list of {len(values)}" if isinstance(values, list) else repr(values)
        raise ValueError(f"longrope {name} must be a list of {length} numbers (head_dim / 2), got {got}")
    return tuple(float(v) for v in values)


def _longrope_original_max(params: dict[str, Any], hf: dict[str, Any]) -> int:
    """transformers' Phi-3 reads the top-level original_max_position_embeddings over the rope dict's, and its
    own default 4096 when the top level has none: a rope dict that says otherwise alone is refused."""
    if hf.get("original_max_position_embeddings") is not None:
        return int(hf["original_max_position_embeddings"])
    inner = params.get("original_max_position_embeddings")
    if inner is not None and int(inner) != 4096:
        raise ValueError(f"longrope rope_scaling sets original_max_position_embeddings={inner!r} without the "
                         "top-level field: transformers' Phi-3 would read its default 4096 instead; set the "
                         "top-level original_max_position_embeddings")
    return 4096


def fit_max_model_len(config: ModelConfig, max_model_len: int | None) -> ModelConfig:
    """`config` for an engine whose sequences hold at most max_model_len tokens (None: max_position_embeddings).

    LongRoPE serves every position with its long factors when max_model_len passes
    original_max_position_embeddings, with its short ones otherwise: a static choice, vLLM's. transformers picks
    per forward call from the largest position, which a compiled graph cannot; the two agree while a sequence
    stays within original_max_position_embeddings (short) or starts past it (long)."""
    rope = config.rope
    if rope.rope_type != "longrope":
        return config
    length = config.max_position_embeddings if max_model_len is None else max_model_len
    return replace(config, rope=replace(rope, use_long_factor=length > rope.original_max_position_embeddings))


def _eos_ids(hf: dict[str, Any]) -> tuple[int, ...]:
    eos = hf.get("eos_token_id")
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, list) else (int(eos),)


def model_config_from_hf(hf: dict[str, Any], architecture: str, **family: Any) -> ModelConfig:
    """Common Llama-family fields; `family` holds the architecture's own flags (qk_norm, ..., a rope of its own)."""
    heads = hf["num_attention_heads"]
    rope = family.pop("rope", None) or rope_from_hf(hf)
    return ModelConfig(
        architecture=architecture,
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        intermediate_size=hf["intermediate_size"],
        num_hidden_layers=hf["num_hidden_layers"],
        num_attention_heads=heads,
        num_key_value_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
        rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
        max_position_embeddings=hf.get("max_position_embeddings", 4096),
        rope=rope,
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        eos_token_ids=_eos_ids(hf),
        **family,
    )
