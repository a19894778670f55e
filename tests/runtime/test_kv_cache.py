from graphllm.runtime.kv_cache import BlockPool
from graphllm.runtime.sampling_params import SamplingParams
from graphllm.runtime.sequence import Sequence


def make_seq(seq_id, num_tokens):
    return Sequence(seq_id, f"r{seq_id}", 0, list(range(num_tokens)), num_tokens, SamplingParams())


def test_allocate_rounds_up_to_blocks_and_free_returns_them():
    pool = BlockPool(num_blocks=10, block_size=4)
    seq = make_seq(0, 9)
    assert pool.blocks_needed(seq, 9) == 3
    pool.allocate(seq, 9)
    assert len(seq.block_table) == 3 and pool.num_free_blocks == 7
    seq.num_computed_tokens = 9
    assert pool.blocks_needed(seq, 3) == 0  # 12 tokens still fit in 3 blocks
    assert pool.blocks_needed(seq, 4) == 1
    pool.free(seq)
    assert pool.num_free_blocks == 10 and seq.block_table == [] and seq.num_computed_tokens == 0


def test_can_allocate_refuses_beyond_pool():
    pool = BlockPool(num_blocks=2, block_size=4)
    seq = make_seq(0, 9)
    assert not pool.can_allocate(seq, 9)
    assert pool.can_allocate(seq, 8)


def test_fork_shares_blocks_until_last_reference_goes():
    pool = BlockPool(num_blocks=4, block_size=4)
    parent, child = make_seq(0, 8), make_seq(1, 8)
    pool.allocate(parent, 8)
    pool.fork(parent, child)
    assert child.block_table == parent.block_table and pool.num_free_blocks == 2
    pool.free(parent)
    assert pool.num_free_blocks == 2  # child still holds them
    pool.free(child)
    assert pool.num_free_blocks == 4 and pool.ref_counts == [0, 0, 0, 0]
