"""The paged KV cache: a pool of fixed-size blocks with reference counts, and its tensors.

A sequence owns a block table (list of block ids); token i of the sequence lives in block
block_table[i // block_size] at offset i % block_size. A block returns to the pool when its
reference count drops to zero, so blocks can be shared (forks, and later prefix caching).
"""

from collections import deque

import torch

from graphllm.models.config import ModelConfig
from graphllm.runtime.sequence import Sequence


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.free_blocks: deque[int] = deque(range(num_blocks))
        self.ref_counts = [0] * num_blocks

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    def blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        """Blocks to add so that the cache holds num_computed + num_new_tokens tokens of seq."""
        total = seq.num_computed_tokens + num_new_tokens
        return max(0, -(-total // self.block_size) - len(seq.block_table))

    def can_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.blocks_needed(seq, num_new_tokens) <= len(self.free_blocks)

    def allocate(self, seq: Sequence, num_new_tokens: int) -> None:
        needed = self.blocks_needed(seq, num_new_tokens)
        if not needed:  # most decode steps: the token fits in the last block
            return
        if needed > len(self.free_blocks):
            raise RuntimeError(f"KV cache out of blocks: need {needed}, have {len(self.free_blocks)}")
        for _ in range(needed):
            block = self.free_blocks.popleft()
            self.ref_counts[block] = 1
            seq.block_table.append(block)

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Let child share all of parent's blocks (copy-free); each gains a reference."""
        for block in parent.block_table:
            self.ref_counts[block] += 1
        child.block_table = list(parent.block_table)
        child.num_computed_tokens = parent.num_computed_tokens

    def free(self, seq: Sequence) -> None:
        """Drop seq's references; blocks nobody else holds go back to the pool."""
        for block in reversed(seq.block_table):
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self.free_blocks.append(block)
        seq.block_table = []
        seq.num_computed_tokens = 0


def kv_bytes_per_block(config: ModelConfig, block_size: int, kv_cache_dtype: torch.dtype) -> int:
    """Bytes of one block over all layers, K and V, in the cache's element type."""
    per_layer = 2 * block_size * config.num_key_value_heads * config.head_dim
    return per_layer * config.num_hidden_layers * kv_cache_dtype.itemsize


def allocate_kv_caches(config: ModelConfig, num_blocks: int, block_size: int, kv_cache_dtype: torch.dtype,
                       device: torch.device) -> list[torch.Tensor]:
    """One [2, num_blocks, block_size, Hkv, D] tensor per layer (the step's kv_caches input), of
    kv_cache_dtype: the model's dtype, or float8_e4m3fn (graphllm/kernels/kv_quant.py)."""
    shape = (2, num_blocks, block_size, config.num_key_value_heads, config.head_dim)
    return [torch.zeros(shape, dtype=kv_cache_dtype, device=device) for _ in range(config.num_hidden_layers)]
