"""The pure-PyTorch multi-head latent attention (graphllm/ops/mla_attention.py): what the torch backend runs.

The cache holds one entry of C = kv_lora_rank + qk_rope_head_dim values per token ([1, blocks, block_size, 1, C]);
every query head scores against the whole entry and reads its first kv_lora_rank values (the latent) as the value:

    scores[t, h, l] = scale * q[t, h] . entry[l]         (q: the absorbed q_nope, then the rotated q_pe)
    out[t, h]       = softmax_l(scores, causal) @ entry[:, :kv_lora_rank]

Plain torch, float32, over gathered pages: small CPU batches and tests, not speed; the oracle of the Triton kernels
(kernels/mla_decode.py, kernels/mla_prefill.py), whose backend also writes the cache with write_latent_cache.
"""

import torch


def write_latent_cache(kv: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Store the new tokens' entries ([T, C]) at their slots of kv_cache [1, blocks, block_size, 1, C]."""
    flat = kv_cache.view(-1, kv_cache.shape[-1])  # [slots, C]
    flat.index_copy_(0, slot_mapping, kv.to(kv_cache.dtype))


def reference_mla_attention(q: torch.Tensor, kv_cache: torch.Tensor, positions: torch.Tensor,
                            block_tables: torch.Tensor, query_start_loc: torch.Tensor, scale: float,
                            kv_lora_rank: int) -> torch.Tensor:
    """q [T, H, C] over each token's sequence's cached entries -> [T, H, kv_lora_rank] float32."""
    num_tokens = q.shape[0]
    token_ids = torch.arange(num_tokens, device=q.device)
    seq_of_token = torch.searchsorted(query_start_loc[1:], token_ids, right=True)  # [T]
    blocks = block_tables[seq_of_token]  # [T, M]
    entries = kv_cache[0][blocks].flatten(1, 2)[:, :, 0].float()  # [T, L, C]
    scores = torch.einsum("thc,tlc->thl", q.float(), entries) * scale  # [T, H, L]
    key_pos = torch.arange(entries.shape[1], device=q.device)
    visible = key_pos[None, :] <= positions[:, None]  # [T, L]
    scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
    return torch.einsum("thl,tlc->thc", scores.softmax(-1), entries[..., :kv_lora_rank])
