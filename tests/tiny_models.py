"""Tiny random-weight Hugging Face model folders for tests (no downloads).

One config per architecture we claim; each one exercises that family's difference
(llama3 rope scaling, sliding window, q/k/v bias, q/k norm, tied embeddings).
"""

import copy
from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers

VOCAB = 128
WORDS = [f"w{i}" for i in range(VOCAB - 3)]
SPECIALS = ["<unk>", "<s>", "</s>"]  # ids 0, 1, 2

COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
              bos_token_id=1, eos_token_id=2, initializer_range=0.1)

CONFIGS = {
    "llama": ("LlamaConfig", dict(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                "high_freq_factor": 4.0, "original_max_position_embeddings": 32})),
    "mistral": ("MistralConfig", dict(sliding_window=8, tie_word_embeddings=False)),
    "qwen2": ("Qwen2Config", dict(tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", dict(head_dim=32, tie_word_embeddings=False)),
    "olmo2": ("Olmo2Config", dict(tie_word_embeddings=False, rms_norm_eps=1e-6)),
    "phi3": ("Phi3Config", dict(tie_word_embeddings=False, pad_token_id=0, sliding_window=6)),
    # mixtures of experts: every layer sparse, window shorter than the prompts; Qwen3-MoE with the top-k
    # weights renormalised, then with them as the softmax gives them, layer 0 dense and tied embeddings
    "mixtral": ("MixtralConfig", dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
                                      tie_word_embeddings=False)),
    "qwen3_moe": ("Qwen3MoeConfig", dict(head_dim=32, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                                         norm_topk_prob=True, tie_word_embeddings=False)),
    "qwen3_moe-mixed": ("Qwen3MoeConfig", dict(num_experts=6, num_experts_per_tok=3, moe_intermediate_size=48,
                                               norm_topk_prob=False, mlp_only_layers=[0], tie_word_embeddings=True)),
    # Gemma: layer 0 sliding (window shorter than the prompts), layer 1 global, query_pre_attn_scalar != head_dim;
    # Gemma 2 with both soft caps small enough to bend (the attention one changes greedy tokens); Gemma 3 with its
    # layer types the other way round, linear rope scaling on the global layer, the local rope base apart
    "gemma2": ("Gemma2Config", dict(head_dim=16, query_pre_attn_scalar=24, sliding_window=8,
                                    attn_logit_softcapping=1.0, final_logit_softcapping=5.0)),
    "gemma3": ("Gemma3TextConfig", dict(head_dim=16, query_pre_attn_scalar=12, sliding_window=6,
                                        layer_types=["full_attention", "sliding_attention"],
                                        rope_scaling={"rope_type": "linear", "factor": 8.0})),
    # DeepSeek-V2 (MLA + shared experts): V2-Lite's layout (q_proj, no q_lora_rank), layer 0 dense, yarn rope with
    # V2-Lite's mscales over a short original context, experts scaled; then with the q lora path and default rope
    "deepseek_v2": ("DeepseekV2Config", dict(
        kv_lora_rank=32, q_lora_rank=None, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12,
        n_routed_experts=6, num_experts_per_tok=2, n_shared_experts=2, moe_intermediate_size=24,
        first_k_dense_replace=1, routed_scaling_factor=1.5, topk_method="greedy", norm_topk_prob=False,
        num_key_value_heads=4,  # MLA: one latent per token; transformers wants as many KV heads as query heads
        rope_scaling={"rope_type": "yarn", "factor": 40.0, "beta_fast": 32, "beta_slow": 1, "mscale": 0.707,
                      "mscale_all_dim": 0.707, "original_max_position_embeddings": 16},
        max_position_embeddings=640, tie_word_embeddings=False)),  # 640 / 16: the factor 40 as V2-Lite
    "deepseek_v2-qlora": ("DeepseekV2Config", dict(
        kv_lora_rank=24, q_lora_rank=40, qk_nope_head_dim=8, qk_rope_head_dim=16, v_head_dim=16,
        n_routed_experts=4, num_experts_per_tok=3, n_shared_experts=1, moe_intermediate_size=32,
        first_k_dense_replace=1, topk_method="greedy", num_key_value_heads=4, tie_word_embeddings=False)),
}
# Gemma's norms scale by (1 + weight) and start at zero: random weights make a dropped `1 +` or weight show
RANDOM_NORMS = ("gemma2", "gemma3")

# Configs outside the CONFIGS matrix (tests/conftest.ARCHS), each with a test file of its own. Phi-3 LongRoPE's
# tokens depend on the engine's max_model_len (its long or short factors), so the matrix's prompts and settings
# cannot hold for it: tests/models/test_phi3_longrope.py. A short original context (32 of 256 positions: the
# attention factor sqrt(1 + ln 8 / ln 32)) and factor sets far apart, so that either wrong choice changes tokens.
EXTRA_CONFIGS = {
    "phi3-longrope": ("Phi3Config", dict(
        tie_word_embeddings=False, pad_token_id=0, original_max_position_embeddings=32,
        rope_scaling={"type": "longrope", "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.0, 3.5],
                      "long_factor": [1.0, 2.0, 4.0, 8.0, 16.0, 24.0, 32.0, 48.0]})),
}


def make_tokenizer() -> transformers.PreTrainedTokenizerFast:
    vocab = {tok: i for i, tok in enumerate(SPECIALS + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    from tokenizers import decoders
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>",
                                                bos_token="<s>", eos_token="</s>")


def make_hf_model(arch: str, seed: int = 0) -> transformers.PreTrainedModel:
    config_cls, extra = CONFIGS[arch] if arch in CONFIGS else EXTRA_CONFIGS[arch]
    # extra may override COMMON; a copy, since transformers fills its rope_scaling dict in place
    config = getattr(transformers, config_cls)(**copy.deepcopy({**COMMON, **extra}))
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    if arch in RANDOM_NORMS:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("norm.weight"):
                    p.normal_(0.0, 0.5)
    return model


def save_model_folder(model: transformers.PreTrainedModel, path: Path, **save_kwargs) -> Path:
    model.save_pretrained(path, **save_kwargs)
    make_tokenizer().save_pretrained(path)
    return path
