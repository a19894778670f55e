"""config.json `architectures[0]` -> (module class, ModelConfig).

Each entry turns the Hugging Face config dict into a ModelConfig with that architecture's
flags; the module class is shared when the difference is only a flag.
"""

from typing import Any, Callable

from torch import nn

from graphllm.models.config import ModelConfig, fit_max_model_len, model_config_from_hf, rope_from_hf
from graphllm.models.deepseek_v2 import DeepseekV2ForCausalLM
from graphllm.models.gemma import GemmaForCausalLM
from graphllm.models.gemma_config import gemma2_config, gemma3_config
from graphllm.models.llama import LlamaForCausalLM
from graphllm.models.mixtral import MixtralForCausalLM
from graphllm.models.olmo2 import Olmo2ForCausalLM
from graphllm.models.phi3 import Phi3ForCausalLM
from graphllm.models.quantization import read_checkpoint_quantization
from graphllm.models.qwen3_moe import Qwen3MoeForCausalLM


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
    # transformers 5 keeps it in rope_parameters too (Phi-3.5 / Phi-4-mini set it)
    partial = hf.get("partial_rotary_factor", (hf.get("rope_parameters") or {}).get("partial_rotary_factor", 1.0))
    if float(partial or 1.0) != 1.0:
        raise ValueError(f"config.json sets partial_rotary_factor={partial!r}: rope over part of each head is not "
                         "supported yet")
    _reject(hf, "attention_bias", "a bias on the q/k/v projection")
    return model_config_from_hf(hf, arch, rope=rope_from_hf(hf, ("default", "longrope")),
                                sliding_window=int(hf.get("sliding_window") or 0), fused_qkv_gate_up=True)


def _check_moe(hf: dict[str, Any], arch: str, num_experts: int) -> None:
    """What graphllm's fused MoE (graphllm/ops/moe.py) does not do, refused by name. A pre-quantized checkpoint
    loads in fp8 only (graphllm.fused_moe_fp8); its parser refuses block-wise fp8, and the loader a quantized
    router or a layer whose experts are partly quantized (models/quantization/experts.py)."""
    quant = read_checkpoint_quantization(hf)
    if quant is not None and quant.scheme != "fp8":
        raise ValueError(f"config.json sets quantization_config with quant_method={quant.method!r} ({quant.scheme}): "
                         f"a pre-quantized {arch} checkpoint loads in fp8 only (the fused MoE has no int4 path)")
    if hf.get("hidden_act", "silu") != "silu":
        raise ValueError(f"config.json sets hidden_act={hf['hidden_act']!r}: {arch}'s experts run SiLU only")
    top_k = hf.get("num_experts_per_tok")
    if not isinstance(top_k, int) or not 0 < top_k <= num_experts:
        raise ValueError(f"config.json sets num_experts_per_tok={top_k!r} for {num_experts} experts")


def _mixtral(hf: dict[str, Any], arch: str) -> ModelConfig:
    experts = int(hf["num_local_experts"])
    _check_moe(hf, arch, experts)
    return model_config_from_hf(hf, arch, sliding_window=int(hf.get("sliding_window") or 0), num_experts=experts,
                                num_experts_per_tok=hf["num_experts_per_tok"], norm_topk_prob=True,
                                moe_intermediate_size=hf["intermediate_size"],  # Mixtral's MLPs are all experts
                                sparse_layers=tuple(range(hf["num_hidden_layers"])))


def _qwen3_moe(hf: dict[str, Any], arch: str) -> ModelConfig:
    _reject(hf, "use_sliding_window", "Qwen3-MoE's per-layer sliding window")
    _reject(hf, "shared_expert_intermediate_size", "a shared expert (Qwen2-MoE's)")
    experts = int(hf["num_experts"] if "num_experts" in hf else hf.get("num_local_experts") or 0)  # v4 / v5 names
    if experts:
        _check_moe(hf, arch, experts)
    step, dense = int(hf.get("decoder_sparse_step") or 1), set(hf.get("mlp_only_layers") or ())
    sparse = tuple(i for i in range(hf["num_hidden_layers"]) if experts and i not in dense and (i + 1) % step == 0)
    return model_config_from_hf(hf, arch, attention_bias=bool(hf.get("attention_bias", False)), qk_norm=True,
                                num_experts=experts, num_experts_per_tok=int(hf.get("num_experts_per_tok") or 0),
                                moe_intermediate_size=int(hf.get("moe_intermediate_size") or 0),
                                norm_topk_prob=bool(hf.get("norm_topk_prob", False)), sparse_layers=sparse)


def _check_deepseek_v2_routing(hf: dict[str, Any], arch: str) -> None:
    """DeepSeek-V2's routing variants that graphllm (and transformers' DeepseekV2 router) do not run, by name."""
    if (method := hf.get("topk_method") or "greedy") != "greedy":
        raise ValueError(f"config.json sets topk_method={method!r}: only 'greedy' expert selection is supported "
                         "(DeepSeek-V2-Lite's); group_limited_greedy and noaux_tc are not implemented yet")
    if (scoring := hf.get("scoring_func") or "softmax") != "softmax":
        raise ValueError(f"config.json sets scoring_func={scoring!r}: {arch}'s router scores with softmax only")
    _reject(hf, "norm_topk_prob", f"{arch} with renormalised top-k weights (transformers' DeepseekV2 ignores it, "
                                  "DeepSeek's own code renormalises instead of scaling)")
    _reject(hf, "mlp_bias", "a bias on the MLP projections")


def _deepseek_v2(hf: dict[str, Any], arch: str) -> ModelConfig:
    experts = int(hf.get("n_routed_experts") or 0)
    if not experts:
        raise ValueError(f"config.json sets n_routed_experts={hf.get('n_routed_experts')!r}: a dense {arch} is not "
                         "supported yet")
    _reject(hf, "quantization_config", f"a pre-quantized {arch} checkpoint (its attention absorbs kv_b_proj's "
                                       "float weight)")
    _check_moe(hf, arch, experts)
    _check_deepseek_v2_routing(hf, arch)
    first_dense, freq = int(hf.get("first_k_dense_replace") or 0), int(hf.get("moe_layer_freq") or 1)
    sparse = tuple(i for i in range(hf["num_hidden_layers"]) if i >= first_dense and i % freq == 0)
    nope, rope = int(hf["qk_nope_head_dim"]), int(hf["qk_rope_head_dim"])
    heads = hf["num_attention_heads"]
    # head_dim: a query/key head (nope + rope); one KV head per query head is what standard attention would cache
    shape = {**hf, "head_dim": nope + rope, "num_key_value_heads": heads}
    return model_config_from_hf(
        shape, arch, rope=rope_from_hf(hf, ("default", "yarn")), attention_bias=bool(hf.get("attention_bias", False)), num_experts=experts,
        num_experts_per_tok=hf["num_experts_per_tok"], moe_intermediate_size=int(hf["moe_intermediate_size"]),
        sparse_layers=sparse, kv_lora_rank=int(hf["kv_lora_rank"]), q_lora_rank=int(hf.get("q_lora_rank") or 0),
        qk_nope_head_dim=nope, qk_rope_head_dim=rope, v_head_dim=int(hf["v_head_dim"]),
        n_shared_experts=int(hf.get("n_shared_experts") or 0),
        routed_scaling_factor=float(hf.get("routed_scaling_factor") or 1.0))


ConfigBuilder = Callable[[dict[str, Any], str], ModelConfig]

ARCHITECTURES: dict[str, tuple[type[nn.Module], ConfigBuilder]] = {
    "LlamaForCausalLM": (LlamaForCausalLM, _llama),
    "MistralForCausalLM": (LlamaForCausalLM, _mistral),
    "Qwen2ForCausalLM": (LlamaForCausalLM, _qwen2),
    "Qwen3ForCausalLM": (LlamaForCausalLM, _qwen3),
    "Olmo2ForCausalLM": (Olmo2ForCausalLM, _olmo2),
    "Phi3ForCausalLM": (Phi3ForCausalLM, _phi3),
    "MixtralForCausalLM": (MixtralForCausalLM, _mixtral),
    "Qwen3MoeForCausalLM": (Qwen3MoeForCausalLM, _qwen3_moe),
    "Gemma2ForCausalLM": (GemmaForCausalLM, gemma2_config),
    "Gemma3ForCausalLM": (GemmaForCausalLM, gemma3_config),
    "DeepseekV2ForCausalLM": (DeepseekV2ForCausalLM, _deepseek_v2),
}


# config.json fields that change the math in families we do not build yet (Gemma's soft-caps and query
# scale outside Gemma, Granite's multipliers, partial rope): a config that sets one is refused by name, never
# run without it. Phi-3 reads partial_rotary_factor itself (its builder refuses anything but 1.0); the
# architectures in MATH_FIELDS_READ read theirs (models/gemma.py).
MATH_FIELDS = {"attn_logit_softcapping": None, "final_logit_softcapping": None, "query_pre_attn_scalar": None,
               "embedding_multiplier": 1.0, "residual_multiplier": 1.0, "attention_multiplier": None,
               "logits_scaling": 1.0, "partial_rotary_factor": 1.0}


GEMMA_MATH_FIELDS = ("attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar")
MATH_FIELDS_READ: dict[str, tuple[str, ...]] = {"Gemma2ForCausalLM": GEMMA_MATH_FIELDS,
                                                "Gemma3ForCausalLM": GEMMA_MATH_FIELDS}


def _reject_math_fields(hf: dict[str, Any], arch: str) -> None:
    for key, neutral in MATH_FIELDS.items():
        if key in MATH_FIELDS_READ.get(arch, ()):
            continue
        if hf.get(key) is not None and hf[key] != neutral:
            raise ValueError(f"config.json sets {key}={hf[key]!r}, which changes the math of {arch} in a way "
                             "graphllm does not implement: refused rather than run without it")


def resolve_architecture(hf: dict[str, Any], max_model_len: int | None = None) -> tuple[type[nn.Module], ModelConfig]:
    """The module class and ModelConfig for a Hugging Face config dict (MATH_FIELDS refused by name), fitted to
    an engine of max_model_len tokens (None: the model's max_position_embeddings): LongRoPE's factors."""
    archs = hf.get("architectures") or []
    if not archs:
        raise ValueError("config.json has no 'architectures' entry; cannot tell which model to build")
    if not isinstance(archs, list):  # a bare string would read as its first letter
        raise ValueError(f"config.json 'architectures' must be a list of names, got {archs!r}")
    arch = archs[0]
    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {arch!r}; supported: {', '.join(sorted(ARCHITECTURES))}")
    module_cls, build_config = ARCHITECTURES[arch]
    try:
        config = build_config(hf, arch)
    except KeyError as e:  # a field the family needs (hidden_size, rope_scaling's factor, ...)
        raise ValueError(f"config.json of {arch} lacks the field {e} (or a field of its rope_scaling)") from e
    except (TypeError, AttributeError) as e:  # a field of the wrong JSON type
        raise ValueError(f"config.json of {arch} has a field of the wrong type: {e}") from e
    _reject_math_fields(hf, arch)
    return module_cls, fit_max_model_len(config, max_model_len)
