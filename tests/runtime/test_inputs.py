"""prepare_step: a mixed batch (decode, chunked prefill, fresh prefill) becomes the flat step
tensors of DESIGN.md's contract, moved to the device in one packed, aligned buffer."""

import numpy as np
import torch

from graphllm.runtime.inputs import ALIGN, prepare_step
from graphllm.runtime.sampling_params import SamplingParams
from graphllm.runtime.scheduler import ScheduledSeq
from graphllm.runtime.sequence import Sequence


def seq(tokens, computed, table):
    s = Sequence(0, "r", 0, list(tokens), len(tokens), SamplingParams())
    s.num_computed_tokens, s.block_table = computed, list(table)
    return s


def mixed_batch():
    decode = seq(range(100, 120), 19, [7, 3])  # 20 tokens, the last one new
    chunk = seq(range(200, 240), 16, [5, 9, 2])  # 40 tokens: 16 cached, next 6 now (no sample)
    fresh = seq(range(300, 305), 0, [8])  # 5 tokens, all new
    return [ScheduledSeq(decode, 1), ScheduledSeq(chunk, 6), ScheduledSeq(fresh, 5)]


def test_mixed_batch_fields():
    host = prepare_step(mixed_batch(), block_size=16)
    assert host.input_ids.tolist() == [119, *range(216, 222), *range(300, 305)]
    assert host.positions.tolist() == [19, *range(16, 22), *range(5)]
    assert host.slot_mapping.tolist() == [3 * 16 + 3, *(9 * 16 + p for p in range(6)), *(8 * 16 + p for p in range(5))]
    assert host.block_tables.tolist() == [[7, 3, 0], [5, 9, 2], [8, 0, 0]]
    assert host.seq_lens.tolist() == [20, 22, 5] and host.query_start_loc.tolist() == [0, 1, 7, 12]
    assert host.logits_indices.tolist() == [0, 11]  # the chunk does not sample yet
    assert not host.attention.is_decode


def test_to_device_is_one_aligned_buffer_with_the_same_values():
    host = prepare_step(mixed_batch(), block_size=16)
    inputs = host.to_device([], torch.device("cpu"))
    flat = inputs.flat()[:-1]
    base = flat[0].untyped_storage().data_ptr()
    for tensor, array in zip(flat, host):
        assert tensor.untyped_storage().data_ptr() == base  # one buffer, one copy
        assert tensor.storage_offset() % ALIGN == 0
        assert np.array_equal(tensor.numpy(), array)


def test_decode_batch_is_decode_and_its_pages_are_listed():
    batch = [ScheduledSeq(seq(range(40), 39, [4, 6, 1]), 1), ScheduledSeq(seq(range(16), 15, [2]), 1)]
    host = prepare_step(batch, block_size=16)
    assert host.attention.is_decode and host.input_ids.tolist() == [39, 15]
    indptr, indices, last = host.attention.paged_kv(16)
    assert indptr.tolist() == [0, 3, 4] and indices.tolist() == [4, 6, 1, 2] and last.tolist() == [8, 16]
