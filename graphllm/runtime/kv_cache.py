"""The paged KV cache: a pool of fixed-size blocks with reference counts, and its tensors.

A sequence owns a block table (list of block ids); token i of the sequence lives in block
block_table[i // block_size] at offset i % block_size. A block returns to the pool when its
reference count drops to zero, so blocks can be shared (forks, and prefix caching).

Prefix caching (vLLM's automatic prefix caching): a full block is keyed by a chained hash, BLAKE2b
with a 16-byte digest (128 bits) over its parent block's key and its own token ids, so one key names
the whole prefix up to the block's end (extra_key, hashed into the first block, is for anything else
that changes K/V; nothing does yet). Once a block is full and computed its key is registered. A block
whose last reference is dropped keeps its key and goes to the tail of the free queue; allocation takes
the head, so cached blocks are evicted least recently freed first, after never-cached ones. A sequence
admitted with no computed tokens (new, or preempted) first takes the longest run of cached blocks
that its known tokens key, up to num_tokens - 1 tokens: its last token is always computed, to sample.

    pool.cached_prefix(seq) -> blocks      (lookup only; record_lookup counts it once admitted)
    pool.can_allocate(seq, n, blocks)      (the hits that sit in the free queue are not free for n)
    pool.allocate(seq, n, blocks)          (takes the hits, then fresh blocks for n new tokens)
    pool.register_full_blocks(seq)         (after a step: keys the blocks it filled)
"""

import array
import hashlib
import math
from collections import OrderedDict

import torch

from graphllm.models.config import ModelConfig
from graphllm.runtime.sequence import PENDING, Sequence


def block_key(parent: bytes, tokens: list[int]) -> bytes:
    """The chained key of a full block: 128-bit BLAKE2b of the parent's key and the block's token ids (as
    int64s in the machine's byte order: keys live in one process)."""
    h = hashlib.blake2b(parent, digest_size=16)
    h.update(array.array("q", tokens).tobytes())
    return h.digest()


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False,
                 extra_key: bytes = b""):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.free_blocks: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))  # head: next to go
        self.ref_counts = [0] * num_blocks
        self.enable_prefix_caching = enable_prefix_caching
        self.extra_key = extra_key
        self.block_keys: list[bytes | None] = [None] * num_blocks  # the key a cached block is registered under
        self.cached: dict[bytes, int] = {}  # key -> block
        self.prefix_cache_queries = 0  # prompt tokens looked up, and how many hit (vLLM's counters)
        self.prefix_cache_hits = 0

    @property
    def num_free_blocks(self) -> int:
        """Blocks no sequence holds, cached ones included (they are evicted on demand)."""
        return len(self.free_blocks)

    @property
    def num_cached_blocks(self) -> int:
        return len(self.cached)

    def blocks_needed(self, seq: Sequence, num_new_tokens: int, num_hit_blocks: int = 0) -> int:
        """Blocks to add so that the cache holds num_computed + num_new_tokens tokens of seq (after taking
        num_hit_blocks cached blocks, which bring their tokens as computed)."""
        total = seq.num_computed_tokens + num_hit_blocks * self.block_size + num_new_tokens
        return max(0, -(-total // self.block_size) - len(seq.block_table) - num_hit_blocks)

    def can_allocate(self, seq: Sequence, num_new_tokens: int, hits: list[int] = ()) -> bool:
        idle_hits = sum(1 for block in hits if self.ref_counts[block] == 0)  # taking them empties the queue
        return self.blocks_needed(seq, num_new_tokens, len(hits)) <= len(self.free_blocks) - idle_hits

    def allocate(self, seq: Sequence, num_new_tokens: int, hits: list[int] = ()) -> None:
        """Append the cached blocks hits (a sequence with nothing computed: cached_prefix's answer) and
        fresh blocks for num_new_tokens more tokens to seq's block table."""
        if hits:
            assert not seq.block_table and seq.num_computed_tokens == 0, "hits go to an empty sequence"
            for block in hits:
                if self.ref_counts[block] == 0:
                    del self.free_blocks[block]
                self.ref_counts[block] += 1
            seq.block_table = list(hits)
            seq.num_computed_tokens = len(hits) * self.block_size
            seq.num_registered_blocks = len(hits)
        needed = self.blocks_needed(seq, num_new_tokens)
        if not needed:  # most decode steps: the token fits in the last block
            return
        if needed > len(self.free_blocks):
            raise RuntimeError(f"KV cache out of blocks: need {needed}, have {len(self.free_blocks)}")
        for _ in range(needed):
            block, _ = self.free_blocks.popitem(last=False)
            self._evict(block)
            self.ref_counts[block] = 1
            seq.block_table.append(block)

    def _evict(self, block: int) -> None:
        key = self.block_keys[block]
        if key is not None:
            self.block_keys[block] = None
            if self.cached.get(key) == block:
                del self.cached[key]

    def truncate(self, seq: Sequence, num_tokens: int) -> None:
        """Keep only what seq's first num_tokens tokens need: num_computed_tokens is capped there and the
        blocks past them go back to the pool, at the head of the free queue (they hold nothing cached).
        Speculative decoding's roll-back of rejected tokens, whose K/V a verify step wrote."""
        keep = -(-num_tokens // self.block_size)
        for block in reversed(seq.block_table[keep:]):
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self.free_blocks[block] = None
                self.free_blocks.move_to_end(block, last=False)
        del seq.block_table[keep:]
        del seq.block_keys[num_tokens // self.block_size:]  # keys past them may name tokens that change
        seq.num_computed_tokens = min(seq.num_computed_tokens, num_tokens)
        seq.num_registered_blocks = min(seq.num_registered_blocks, num_tokens // self.block_size)

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Let child share all of parent's blocks (copy-free); each gains a reference."""
        for block in parent.block_table:
            self.ref_counts[block] += 1
        child.block_table = list(parent.block_table)
        child.num_computed_tokens = parent.num_computed_tokens
        child.block_keys = list(parent.block_keys)
        child.num_registered_blocks = parent.num_registered_blocks

    def free(self, seq: Sequence) -> None:
        """Drop seq's references; blocks nobody else holds go back to the pool (the tail of the free queue:
        a sequence's last blocks first, so its shared head is evicted last). Full computed blocks are
        registered first, so a finished or preempted sequence leaves its prefix cached."""
        self.register_full_blocks(seq)
        for block in reversed(seq.block_table):
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self.free_blocks[block] = None
        seq.block_table = []
        seq.num_computed_tokens = seq.num_registered_blocks = 0

    # -- prefix caching ---------------------------------------------------------------------------

    def _extend_keys(self, seq: Sequence, num_tokens: int) -> None:
        """seq.block_keys for every full block within its first num_tokens tokens (none past a PENDING one)."""
        bs, keys = self.block_size, seq.block_keys
        while (len(keys) + 1) * bs <= num_tokens:
            start = len(keys) * bs
            tokens = seq.token_ids[start:start + bs]
            if PENDING in tokens:
                return
            keys.append(block_key(keys[-1] if keys else self.extra_key, tokens))

    def cached_prefix(self, seq: Sequence) -> list[int]:
        """The cached blocks that hold seq's longest cached prefix (at most num_tokens - 1 tokens), for a
        sequence with nothing computed; [] when caching is off. A lookup only: record_lookup counts it
        once the sequence is admitted."""
        if not self.enable_prefix_caching or seq.num_computed_tokens:
            return []
        limit = seq.num_tokens - 1
        self._extend_keys(seq, limit)
        hits = []
        for key in seq.block_keys[:limit // self.block_size]:
            block = self.cached.get(key)
            if block is None:
                break
            hits.append(block)
        return hits

    def record_lookup(self, seq: Sequence, hits: list[int]) -> None:
        """Count an admitted sequence's lookup (tokens queried and hit); its first sets num_cached_tokens."""
        if not self.enable_prefix_caching:
            return
        self.prefix_cache_queries += seq.num_tokens
        self.prefix_cache_hits += len(hits) * self.block_size
        if seq.num_cached_tokens is None:
            seq.num_cached_tokens = len(hits) * self.block_size

    def register_full_blocks(self, seq: Sequence) -> None:
        """Register the keys of seq's full blocks whose tokens are computed (a block whose key some other
        block already holds stays unregistered: a duplicate, evicted when its turn comes)."""
        if not self.enable_prefix_caching:
            return
        full = min(seq.num_computed_tokens // self.block_size, len(seq.block_table))
        if seq.num_registered_blocks >= full:
            return
        self._extend_keys(seq, full * self.block_size)
        for i in range(seq.num_registered_blocks, min(full, len(seq.block_keys))):
            block, key = seq.block_table[i], seq.block_keys[i]
            if self.block_keys[block] is None and key not in self.cached:
                self.block_keys[block] = key
                self.cached[key] = block
            seq.num_registered_blocks = i + 1

    def reset_prefix_cache(self) -> int:
        """Forget every cached key (blocks in use keep their contents); the number forgotten."""
        forgotten = len(self.cached)
        self.cached.clear()
        self.block_keys = [None] * self.num_blocks
        return forgotten


def kv_bytes_per_block(config: ModelConfig, block_size: int, kv_cache_dtype: torch.dtype) -> int:
    """Bytes of one block over all layers, K and V (MLA: the latent entries), in the cache's element type."""
    per_layer = math.prod(config.kv_cache_shape(1, block_size))
    return per_layer * config.num_hidden_layers * kv_cache_dtype.itemsize


def allocate_kv_caches(config: ModelConfig, num_blocks: int, block_size: int, kv_cache_dtype: torch.dtype,
                       device: torch.device) -> list[torch.Tensor]:
    """One [2, num_blocks, block_size, Hkv, D] tensor per layer (the step's kv_caches input), of
    kv_cache_dtype: the model's dtype, or float8_e4m3fn (graphllm/kernels/kv_quant.py). An MLA model's is
    [1, num_blocks, block_size, 1, kv_lora_rank + qk_rope_head_dim] (ModelConfig.kv_cache_shape)."""
    shape = config.kv_cache_shape(num_blocks, block_size)
    return [torch.zeros(shape, dtype=kv_cache_dtype, device=device) for _ in range(config.num_hidden_layers)]
