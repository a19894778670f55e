"""Multi-head latent attention (DeepSeek-V2's MLA) with its paged-cache write, as one registered custom op.

    torch.ops.graphllm.mla_attention(q [T, H, C], kv [T, C], kv_cache [1, blocks, block_size, 1, C], positions,
                                     slot_mapping, block_tables, seq_lens, query_start_loc, scale,
                                     kv_lora_rank) -> [T, H, kv_lora_rank]

with C = kv_lora_rank + qk_rope_head_dim. A token caches one entry of C values, its normalised latent c_kv and
its rotated rope key k_pe side by side (ModelConfig.kv_cache_shape), instead of per-head K and V. The model
(graphllm/models/mla.py) hands the op the absorbed query, q_nope projected through kv_b_proj's key rows (W_uk)
into the latent space, followed by the rotated q_pe; then every head attends over the cached entries as one
shared key (score = q . entry, scaled) and reads the latent part of each entry as the value. The [T, H, L]
result goes back through kv_b_proj's value rows (W_uv) in the model. That is the absorbed form of

    k[t, h] = [c_kv[t] @ W_uk[h].T, k_pe[t]],  v[t, h] = c_kv[t] @ W_uv[h].T

without decompressing a key or value per head. Causality and the step metadata are the attention op's
(graphllm/ops/attention.py). The backend of the enclosing use_backend scope runs it: the torch reference
(graphllm/kernels/mla_reference.py) or the triton backend (graphllm/kernels/mla_decode.py, mla_prefill.py;
interpreter-tested, not yet run on a GPU). FlashInfer refuses MLA models by name, and every backend refuses a
float8 latent cache.
"""

import torch

from graphllm.ops.attention import active_backend


@torch.library.custom_op("graphllm::mla_attention", mutates_args=("kv_cache",))
def mla_attention(q: torch.Tensor, kv: torch.Tensor, kv_cache: torch.Tensor, positions: torch.Tensor,
                  slot_mapping: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
                  query_start_loc: torch.Tensor, scale: float, kv_lora_rank: int) -> torch.Tensor:
    """Write kv ([T, C]) into kv_cache at slot_mapping, then attend q ([T, H, C]) over the cached entries.

    Returns [T, H, kv_lora_rank] in q's dtype: the softmax-weighted sum of the cached latents."""
    return active_backend().mla_forward(q, kv, kv_cache, positions, slot_mapping, block_tables, seq_lens,
                                        query_start_loc, scale, kv_lora_rank)


@mla_attention.register_fake
def _(q, kv, kv_cache, positions, slot_mapping, block_tables, seq_lens, query_start_loc, scale, kv_lora_rank):
    return q.new_empty((q.shape[0], q.shape[1], kv_lora_rank))
