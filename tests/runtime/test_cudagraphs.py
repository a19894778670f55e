"""CUDAGraphRunner's bucket choice, padding and input copying, on CPU with the graph replay
stood in by a direct call of the step on the static buffers (capture itself needs a GPU)."""

import torch

import numpy as np

from graphllm.runtime.cudagraphs import CUDAGraphRunner
from graphllm.runtime.inputs import HostStep


class ReplayByCalling:
    """Stands in for a captured torch.cuda.CUDAGraph: replay() runs the step on the static inputs."""

    def __init__(self, runner, bucket):
        self.runner, self.bucket = runner, bucket

    def replay(self):
        self.runner.outputs[self.bucket] = self.runner.step(*self.runner.static_inputs(self.bucket))


def echo_step(input_ids, positions, slot_mapping, block_tables, seq_lens, query_start_loc, logits_indices,
              kv_caches):
    """'Logits' that expose what the step saw: per sampled row (token, position, slot, seq_len, table sum)."""
    rows = torch.stack([input_ids, positions, slot_mapping, seq_lens, block_tables.sum(1)], 1)
    return rows[logits_indices].float()


def decode_inputs(tokens, positions, slots, tables):
    a = lambda v: np.array(v, dtype=np.int64)  # noqa: E731
    b = len(tokens)
    return HostStep(a(tokens), a(positions), a(slots), a(tables), a(positions) + 1, np.arange(b + 1), np.arange(b))


class RecordingBackend:
    """Records the host metadata each replay was planned with."""

    name = "recording"

    def __init__(self):
        self.plans = []

    def plan(self, host, graph_bucket=None):
        self.plans.append((graph_bucket, host))


def make_runner():
    runner = CUDAGraphRunner(echo_step, [], buckets=(1, 2, 4, 8), max_blocks_per_seq=4, padding_block=99,
                             block_size=1, device=torch.device("cpu"), backend=RecordingBackend())
    runner.graphs = {b: ReplayByCalling(runner, b) for b in runner.buckets}
    return runner


def test_pads_to_next_bucket_and_returns_only_real_rows():
    runner = make_runner()
    inputs = decode_inputs([5, 6, 7], [10, 20, 30], [3, 4, 5], [[1, 2], [3, 0], [4, 5]])
    assert runner.can_run(inputs)
    out = runner.run(inputs)
    assert out.shape == (3, 5)
    assert out[:, 0].tolist() == [5, 6, 7] and out[:, 2].tolist() == [3, 4, 5]
    assert out[:, 3].tolist() == [11, 21, 31] and out[:, 4].tolist() == [3, 3, 9]
    padded = runner.outputs[4][3]  # the padding row of bucket 4 caches its token in the padding block
    assert padded[2].item() == 99 and padded[4].item() == 99 and runner.replays == 1


def test_backend_is_planned_for_the_padded_bucket():
    runner = make_runner()
    runner.run(decode_inputs([5, 6, 7], [10, 20, 30], [3, 4, 5], [[1, 2], [3, 0], [4, 5]]))
    (bucket, host), = runner.backend.plans
    assert bucket == 4 and host.query_start_loc.tolist() == [0, 1, 2, 3, 4]
    assert host.seq_lens.tolist() == [11, 21, 31, 1]
    assert host.block_tables.tolist() == [[1, 2], [3, 0], [4, 5], [99, 0]]
    indptr, indices, last = host.paged_kv(block_size=16)
    assert indptr.tolist() == [0, 1, 3, 5, 6] and indices.tolist() == [1, 3, 0, 4, 5, 99]
    assert last.tolist() == [11, 5, 15, 1]


def test_stale_rows_from_a_bigger_batch_are_reset():
    runner = make_runner()
    runner.run(decode_inputs([1] * 7, [40] * 7, [8] * 7, [[1, 2, 3]] * 7))
    out = runner.run(decode_inputs([2, 3, 4], [1, 2, 3], [6, 7, 8], [[9], [9], [9]]))
    assert out[:, 4].tolist() == [9, 9, 9]  # columns past the new width were zeroed
    pad = runner.outputs[4][3].tolist()  # the padding row of bucket 4 forgot the 7-row batch
    assert pad == [0, 0, 99, 1, 99]


def test_refuses_prefill_and_oversized_batches():
    runner = make_runner()
    prefill = decode_inputs([1, 2], [0, 1], [0, 1], [[1], [1]])
    prefill = prefill._replace(input_ids=np.array([1, 2, 3]))
    assert not runner.can_run(prefill)
    assert not runner.can_run(decode_inputs([1] * 9, [0] * 9, [0] * 9, [[1]] * 9))
    assert not runner.can_run(decode_inputs([1], [0], [0], [[1, 2, 3, 4, 5]]))


def test_static_query_start_loc_is_copied_whole():
    """Regression: only the first `bucket` entries of query_start_loc [bucket + 1] were copied, so the
    last offset of a replayed batch read whatever the device buffer held (0): out-of-range gathers."""
    runner = make_runner()
    runner.static.query_start_loc.fill_(-7)  # what an uncopied device buffer could hold
    runner.run(decode_inputs([5, 6, 7], [10, 20, 30], [3, 4, 5], [[1, 2], [3, 0], [4, 5]]))
    assert runner.static.query_start_loc[:5].tolist() == [0, 1, 2, 3, 4]
