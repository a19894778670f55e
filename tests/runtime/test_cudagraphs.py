"""CUDAGraphRunner's bucket choice, padding and input copying, on CPU with the graph replay
stood in by a direct call of the step on the static buffers (capture itself needs a GPU)."""

import torch

import numpy as np

from graphllm.runtime.cudagraphs import CUDAGraphRunner
from graphllm.runtime.inputs import HostStep
from graphllm.runtime.setup import verify_sizes


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


# -- verify graphs (speculative decoding: q = k + 1 tokens a sequence) ---------------------------------


def echo_tokens_step(input_ids, positions, slot_mapping, block_tables, seq_lens, query_start_loc, logits_indices,
                     kv_caches):
    """echo_step for several tokens a sequence: each token's row shows its sequence's seq_len and table sum."""
    seq = torch.searchsorted(query_start_loc[1:], torch.arange(len(input_ids)), right=True)  # [T]
    rows = torch.stack([input_ids, positions, slot_mapping, seq_lens[seq], block_tables.sum(1)[seq]], 1)
    return rows[logits_indices].float()


def make_verify_runner(step=echo_tokens_step, kv_caches=(), buckets=(1, 2, 4), q=3, max_blocks=4, padding_block=99,
                       block_size=4):
    runner = CUDAGraphRunner(step, list(kv_caches), buckets=buckets, max_blocks_per_seq=max_blocks,
                             padding_block=padding_block, block_size=block_size, device=torch.device("cpu"),
                             backend=RecordingBackend(), tokens_per_seq=q)
    runner.graphs = {b: ReplayByCalling(runner, b) for b in runner.buckets}
    return runner


def verify_inputs():
    """Two sequences: 3 tokens at positions 5-7 (two proposals), 1 token at position 2 (none); block size 4."""
    a = lambda v: np.array(v, dtype=np.int64)  # noqa: E731
    return HostStep(a([11, 12, 13, 21]), a([5, 6, 7, 2]), a([5, 6, 7, 10]), a([[0, 1], [2, 0]]), a([8, 3]),
                    a([0, 3, 4]), a([0, 1, 2, 3]))


def test_verify_rows_are_padded_to_q_tokens_and_gathered_back():
    runner = make_verify_runner()
    host = verify_inputs()
    assert runner.can_run(host)
    out = runner.run(host)
    # real rows come back in the step's order: (token, position, slot, seq_len, table sum)
    assert out.tolist() == [[11, 5, 5, 8, 1], [12, 6, 6, 8, 1], [13, 7, 7, 8, 1], [21, 2, 10, 5, 2]]
    rows = runner.outputs[2].tolist()  # bucket 2, 3 tokens each: the second sequence's padding continues it
    assert [r[:3] for r in rows[3:]] == [[21, 2, 10], [0, 3, 396], [0, 4, 396]]
    (bucket, planned), = runner.backend.plans
    assert bucket == 2 and planned.query_start_loc.tolist() == [0, 3, 6] and planned.seq_lens.tolist() == [8, 5]


def test_verify_graphs_refuse_what_they_cannot_hold():
    runner = make_verify_runner()
    host = verify_inputs()
    assert not runner.can_run(host._replace(logits_indices=np.array([2, 3])))  # a prefill: not every row samples
    four = host._replace(input_ids=np.arange(5), positions=np.array([4, 5, 6, 7, 2]), slot_mapping=np.arange(5),
                         query_start_loc=np.array([0, 4, 5]), logits_indices=np.arange(5))
    assert not runner.can_run(four)  # 4 tokens > q
    near_end = host._replace(seq_lens=np.array([8, 16]))  # its padding would pass max_blocks * block_size (16)
    assert not runner.can_run(near_end)


def test_a_padded_verify_step_computes_what_the_plain_step_does(tiny_model_dir):
    """The tiny Llama's real step, eager: a speculative engine whose verify steps go through the verify runner
    (its graph replay stood in by a call on the static buffers) gives a plain engine's greedy tokens."""
    from graphllm import Engine, SamplingParams
    path, _ = tiny_model_dir("llama")
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    prompts = [[1, 5, 9, 17, 5, 9, 17, 5], [1, 42, 43], [1, 7, 7, 7, 7]]
    want = [o.outputs[0].token_ids for o in Engine.from_pretrained(str(path)).generate(prompts, params)]
    engine = Engine.from_pretrained(str(path), speculative_config={"model": str(path), "num_speculative_tokens": 3})
    runner = engine.runner
    runner.verify_graphs = tuple(make_verify_runner(runner.step, runner.kv_caches, buckets=(1, 2, 4), q=q,
                                                    max_blocks=8, padding_block=engine.state.num_kv_blocks,
                                                    block_size=runner.block_size) for q in verify_sizes(3))
    assert [o.outputs[0].token_ids for o in engine.generate(prompts, params)] == want
    assert [g.q for g in runner.verify_graphs] == [2, 3, 4] and runner.verify_graphs[-1].replays > 0


def test_a_verify_step_replays_the_fewest_tokens_a_sequence_that_hold_it():
    from graphllm.runtime.model_runner import ModelRunner
    assert verify_sizes(1) == (2,) and verify_sizes(4) == (2, 3, 5) and verify_sizes(8) == (2, 3, 5, 9)
    runners = [make_verify_runner(q=q) for q in verify_sizes(4)]
    model_runner = ModelRunner(echo_tokens_step, [], block_size=4, device=torch.device("cpu"),
                               backend=RecordingBackend(), verify_graphs=runners)
    host = verify_inputs()  # 3 tokens, then 1: the q = 3 graphs
    assert model_runner.verify_graph_for(host) is runners[1]
    one_each = host._replace(input_ids=host.input_ids[[0, 3]], positions=np.array([5, 2]),
                             slot_mapping=np.array([5, 10]), seq_lens=np.array([6, 3]),
                             query_start_loc=np.array([0, 1, 2]), logits_indices=np.arange(2))
    assert model_runner.verify_graph_for(one_each) is runners[0]
    six = host._replace(input_ids=np.arange(7), positions=np.array([2, 3, 4, 5, 6, 7, 2]), slot_mapping=np.arange(7),
                        query_start_loc=np.array([0, 6, 7]), logits_indices=np.arange(7))
    assert model_runner.verify_graph_for(six) is None  # 6 tokens > k + 1 = 5: the step runs without a graph
