"""Random-weight models at real shapes, written as ordinary Hugging Face folders.

No download: the config is the published architecture, the weights are N(0, 0.02) (norms 1),
which is enough for speed and memory work; correctness uses tiny configs against transformers.
"""

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from graphllm.models.checkpoint_parts import checkpoint_parts, split_into_parts
from graphllm.models.loader import read_hf_config
from graphllm.models.registry import resolve_architecture

PRESETS: dict[str, dict] = {
    "llama-3-8b": dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=4096, intermediate_size=14336,
                       num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                       vocab_size=128256, rope_theta=500000.0, max_position_embeddings=8192,
                       rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=128000, eos_token_id=128001),
    "llama-3.2-1b": dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=2048, intermediate_size=8192,
                         num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                         vocab_size=128256, rope_theta=500000.0, max_position_embeddings=131072,
                         rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                         rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=128000, eos_token_id=128001),
    "qwen3-0.6b": dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_size=1024, intermediate_size=3072,
                       num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                       vocab_size=151936, rope_theta=1000000.0, max_position_embeddings=40960,
                       rms_norm_eps=1e-6, tie_word_embeddings=True, eos_token_id=151645),
    "qwen2.5-7b": dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_size=3584, intermediate_size=18944,
                       num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                       vocab_size=152064, rope_theta=1000000.0, max_position_embeddings=32768,
                       rms_norm_eps=1e-6, tie_word_embeddings=False, eos_token_id=151645),
    # Phi-3-mini-4k-instruct's config.json (microsoft)
    "phi-3-mini": dict(architectures=["Phi3ForCausalLM"], model_type="phi3", hidden_size=3072, intermediate_size=8192,
                       num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32, vocab_size=32064,
                       rope_theta=10000.0, max_position_embeddings=4096, original_max_position_embeddings=4096,
                       sliding_window=2047, rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1,
                       eos_token_id=32000, pad_token_id=32000),
    # OLMo-2-1124-7B's config.json (allenai)
    "olmo-2-7b": dict(architectures=["Olmo2ForCausalLM"], model_type="olmo2", hidden_size=4096, intermediate_size=11008,
                      num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                      vocab_size=100352, rope_theta=500000.0, max_position_embeddings=4096,
                      rms_norm_eps=1e-6, tie_word_embeddings=False, attention_bias=False, pad_token_id=100277,
                      eos_token_id=100257),
    # Mixtral-8x7B-v0.1's config.json (mistralai): 46.7B parameters, 93 GB of bfloat16
    "mixtral-8x7b": dict(architectures=["MixtralForCausalLM"], model_type="mixtral", hidden_size=4096,
                         intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                         num_local_experts=8, num_experts_per_tok=2, vocab_size=32000, rope_theta=1000000.0,
                         max_position_embeddings=32768, sliding_window=None, rms_norm_eps=1e-5,
                         tie_word_embeddings=False, bos_token_id=1, eos_token_id=2),
    # Qwen3-30B-A3B's config.json (Qwen): 30.5B parameters (3.3B active), 61 GB of bfloat16
    "qwen3-30b-a3b": dict(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", hidden_size=2048,
                          intermediate_size=6144, moe_intermediate_size=768, num_hidden_layers=48,
                          num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128,
                          num_experts_per_tok=8, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                          vocab_size=151936, rope_theta=1000000.0, max_position_embeddings=40960,
                          rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=151643, eos_token_id=151645),
    # gemma-2-9b's config.json (google): no layer_types (even layers slide), both soft caps
    "gemma-2-9b": dict(architectures=["Gemma2ForCausalLM"], model_type="gemma2", hidden_size=3584,
                       intermediate_size=14336, num_hidden_layers=42, num_attention_heads=16, num_key_value_heads=8,
                       head_dim=256, query_pre_attn_scalar=256, sliding_window=4096, attn_logit_softcapping=50.0,
                       final_logit_softcapping=30.0, hidden_activation="gelu_pytorch_tanh", vocab_size=256000,
                       rope_theta=10000.0, max_position_embeddings=8192, rms_norm_eps=1e-6, tie_word_embeddings=True,
                       attention_bias=False, pad_token_id=0, bos_token_id=2, eos_token_id=1),
    # gemma-3-1b-pt's config.json (google): the text-only Gemma 3, 5 local layers to 1 global
    "gemma-3-1b": dict(architectures=["Gemma3ForCausalLM"], model_type="gemma3_text", hidden_size=1152,
                       intermediate_size=6912, num_hidden_layers=26, num_attention_heads=4, num_key_value_heads=1,
                       head_dim=256, query_pre_attn_scalar=256, sliding_window=512, sliding_window_pattern=6,
                       attn_logit_softcapping=None, final_logit_softcapping=None, hidden_activation="gelu_pytorch_tanh",
                       vocab_size=262144, rope_theta=1000000.0, rope_local_base_freq=10000.0, rope_scaling=None,
                       max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=True,
                       attention_bias=False, pad_token_id=0, bos_token_id=2, eos_token_id=1),
    # gemma-3-12b-pt's text_config (google; the published model wraps it in Gemma3ForConditionalGeneration with
    # a vision tower): as a text-only Gemma3ForCausalLM, global layers with linear rope scaling 8
    "gemma-3-12b": dict(architectures=["Gemma3ForCausalLM"], model_type="gemma3_text", hidden_size=3840,
                        intermediate_size=15360, num_hidden_layers=48, num_attention_heads=16, num_key_value_heads=8,
                        head_dim=256, query_pre_attn_scalar=256, sliding_window=1024, sliding_window_pattern=6,
                        attn_logit_softcapping=None, final_logit_softcapping=None,
                        hidden_activation="gelu_pytorch_tanh", vocab_size=262208, rope_theta=1000000.0,
                        rope_local_base_freq=10000.0, rope_scaling={"rope_type": "linear", "factor": 8.0},
                        max_position_embeddings=131072, rms_norm_eps=1e-6, tie_word_embeddings=True,
                        attention_bias=False, pad_token_id=0, bos_token_id=2, eos_token_id=1),
    # DeepSeek-V2-Lite's config.json (deepseek-ai): 15.7B parameters (2.4B active), MLA with a 512 + 64 latent
    # cache per token, layer 0 dense, then 64 routed experts (top 6, greedy) and 2 shared ones; yarn rope
    "deepseek-v2-lite": dict(architectures=["DeepseekV2ForCausalLM"], model_type="deepseek_v2", hidden_size=2048,
                             intermediate_size=10944, moe_intermediate_size=1408, num_hidden_layers=27,
                             num_attention_heads=16, num_key_value_heads=16, kv_lora_rank=512, q_lora_rank=None,
                             qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=64,
                             num_experts_per_tok=6, n_shared_experts=2, first_k_dense_replace=1, moe_layer_freq=1,
                             topk_method="greedy", scoring_func="softmax", norm_topk_prob=False,
                             routed_scaling_factor=1.0, n_group=1, topk_group=1, aux_loss_alpha=0.001,
                             vocab_size=102400, rope_theta=10000, max_position_embeddings=163840,
                             rope_scaling={"type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1,
                                           "mscale": 0.707, "mscale_all_dim": 0.707,
                                           "original_max_position_embeddings": 4096},
                             rms_norm_eps=1e-6, tie_word_embeddings=False, attention_bias=False,
                             bos_token_id=100000, eos_token_id=100001),
}


RESIDUAL_WRITERS = ("o_proj.weight", "down_proj.weight")  # the linears that add into the residual stream
ECHO_RESIDUAL_STD = 1e-6


def random_weights(config: dict, dtype: torch.dtype, device: torch.device, seed: int = 0,
                   echo: bool = False) -> dict[str, torch.Tensor]:
    """Every tensor of the preset's checkpoint, N(0, 0.02) for matrices and ones for norms, named as published:
    a stacked MoE expert weight is written as its per-expert linears (models/checkpoint_parts.py), so
    transformers reads the folder too.

    echo: a model that repeats its last token by a wide margin, for `bench spec`: the linears that write into the
    residual stream are N(0, 1e-6), so each layer adds next to nothing to the embedding, and lm_head's rows are
    the embedding's, so the last token's own logit leads by far. With N(0, 0.02) everywhere the deep random
    network is chaotic and its bf16 logits nearly tie: one kernel path's rounding rather than another's (a
    verify step's against a decode step's) flips greedy tokens early (H200, 8B shape: a batch's sequences first
    differed after 1-11 tokens on average). The work per step is the same."""
    module_cls, model_config = resolve_architecture(config)
    with torch.device("meta"):
        model = module_cls(model_config)
    parts_of: dict[str, dict] = {}
    for name, part in checkpoint_parts(model).items():
        parts_of.setdefault(part.parameter, {})[name] = part
    gen = torch.Generator(device).manual_seed(seed)
    weights = {}
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            tensor = torch.ones(p.shape, dtype=dtype, device=device)
        else:
            std = ECHO_RESIDUAL_STD if echo and name.endswith(RESIDUAL_WRITERS) else 0.02
            tensor = (torch.randn(p.shape, generator=gen, device=device, dtype=torch.float32) * std).to(dtype)
        weights.update(split_into_parts({name: tensor}, parts_of[name]) if name in parts_of else {name: tensor})
    if echo:
        weights["lm_head.weight"] = weights["model.embed_tokens.weight"].clone()
    return weights


def write_preset(name: str, out: str | Path, dtype: torch.dtype = torch.bfloat16,
                 device: str = "cuda" if torch.cuda.is_available() else "cpu", overrides: dict | None = None,
                 echo: bool = False) -> Path:
    """A Hugging Face folder with the preset's config.json (overrides: config fields to change, e.g. fewer
    num_hidden_layers) and random safetensors weights (echo: random_weights)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    config = {**PRESETS[name], **(overrides or {}), "torch_dtype": str(dtype).removeprefix("torch.")}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    weights = random_weights(read_hf_config(out), dtype, torch.device(device), echo=echo)
    save_file({k: v.cpu() for k, v in weights.items()}, str(out / "model.safetensors"))
    return out
