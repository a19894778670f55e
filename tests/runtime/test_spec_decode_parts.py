"""Speculative decoding's parts without a model: SpeculativeConfig and its flag, the n-gram lookup, the
rejection sampler (its exactness, statistically), the KV roll-back, the verify step's inputs, the
scheduler's grant of proposals, and the Prometheus counters."""

import argparse

import numpy as np
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families
from scipy.stats import chisquare

from graphllm.cli.args import add_engine_args, engine_config
from graphllm.config import EngineConfig
from graphllm.runtime.client import EngineStats
from graphllm.runtime.inputs import prepare_step
from graphllm.runtime.kv_cache import BlockPool
from graphllm.runtime.sampling_params import SamplingParams
from graphllm.runtime.scheduler import ScheduledSeq, Scheduler
from graphllm.runtime.sequence import Sequence, SequenceStatus
from graphllm.speculative_config import SpeculativeConfig
from graphllm.runtime.spec_decode.ngram import lookup
from graphllm.runtime.spec_decode.rejection_sampler import Drafts, accept
from graphllm.runtime.spec_decode.stats import SpecDecodeStats


# -- SpeculativeConfig --------------------------------------------------------------------------


def test_config_from_a_dict_with_vllm_defaults():
    config = EngineConfig(speculative_config={"method": "ngram", "num_speculative_tokens": 4,
                                              "prompt_lookup_max": 4, "prompt_lookup_min": 2}).speculative_config
    assert (config.method, config.prompt_lookup_min, config.prompt_lookup_max) == ("ngram", 2, 4)
    assert SpeculativeConfig(3, "ngram").prompt_lookup_min == SpeculativeConfig(3, "ngram").prompt_lookup_max == 5
    assert SpeculativeConfig(3, "ngram", prompt_lookup_max=3).prompt_lookup_min == 3
    assert SpeculativeConfig.from_dict({"model": "d", "num_speculative_tokens": 2}).method == "draft_model"


@pytest.mark.parametrize("options, message", [
    ({"method": "ngram", "num_speculative_tokens": 2, "lookahead": 3}, "unknown key.*'lookahead'"),
    ({"method": "ngram"}, "num_speculative_tokens is required"),
    ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens must be an integer >= 1, got 0"),
    ({"method": "ngram", "num_speculative_tokens": True}, "num_speculative_tokens must be an integer"),
    ({"method": "ngram", "num_speculative_tokens": "4"}, "num_speculative_tokens must be an integer"),
    ({"method": "medusa", "num_speculative_tokens": 2}, "method 'medusa' is not supported yet"),
    ({"method": "lookup", "num_speculative_tokens": 2}, "method must be one of"),
    ({"num_speculative_tokens": 2}, "give method"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 3, "prompt_lookup_max": 2},
     r"prompt_lookup_min \(3\) must be <= prompt_lookup_max \(2\)"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 0}, "prompt_lookup_min must be"),
    ({"method": "ngram", "num_speculative_tokens": 2, "model": "d"}, "'ngram' takes no model"),
    ({"method": "draft_model", "num_speculative_tokens": 2}, "needs model"),
    ({"model": "d", "num_speculative_tokens": 2, "prompt_lookup_max": 3}, "prompt_lookup_max only apply"),
])
def test_config_errors_name_the_key(options, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(speculative_config=options)


def test_the_cli_flag():
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    args = parser.parse_args(["--eager", "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}'])
    assert engine_config(args).speculative_config == SpeculativeConfig(3, "ngram")
    assert engine_config(parser.parse_args(["--eager"])).speculative_config is None
    with pytest.raises(SystemExit):
        parser.parse_args(["--speculative-config", "{not json"])


# -- n-gram lookup --------------------------------------------------------------------------


@pytest.mark.parametrize("tokens, k, low, high, want", [
    ([1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3], 4, 1, 3, [7, 8, 5, 1]),  # the most recent earlier 1 2 3
    ([1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3], 2, 1, 3, [7, 8]),
    ([4, 2, 3, 9, 6, 2, 3, 7, 1, 5, 8, 3], 3, 1, 3, [7, 1, 5]),  # no 2- or 3-gram: the 1-gram 3
    ([4, 2, 3, 9, 6, 2, 3, 7, 1, 5, 8, 3], 3, 2, 3, []),  # ... below prompt_lookup_min
    ([5, 6, 9, 5, 6], 4, 1, 2, [9, 5, 6]),  # fewer: the occurrence is near the end
    ([7, 7, 7], 4, 1, 3, [7]),  # an occurrence may overlap the suffix
    ([1, 2, 3], 4, 1, 3, []),
    ([8, 1, 2, 9, 2, 7, 1, 2], 2, 1, 3, [9, 2]),  # longest first: "1 2" beats the more recent "2"
])
def test_ngram_lookup(tokens, k, low, high, want):
    assert lookup(np.array(tokens), k, low, high) == want


# -- rejection sampler ----------------------------------------------------------------------


def test_greedy_acceptance_is_the_longest_agreeing_prefix_plus_the_targets_token():
    # three sequences: argmax rows [4, 5, 6, 7] / [1, 2] / [3, 3, 3]
    argmax = torch.tensor([4, 5, 6, 7, 1, 2, 3, 3, 3])
    drafts = Drafts([[4, 5, 6], [9], [3, 3]], [True, True, True], [None] * 3)
    num, emitted = accept(drafts, argmax, None)
    assert num == [3, 0, 2]
    assert emitted == [[4, 5, 6, 7], [1], [3, 3, 3]]
    num, emitted = accept(Drafts([[4, 0, 6]], [True], [None]), argmax[:4], None)
    assert (num, emitted) == ([1], [[4, 5]])


def draw_first_tokens(p: torch.Tensor, proposals: list[list[int]], q: torch.Tensor | None) -> tuple:
    """The first and second token each sequence emits, all with target rows p ([k + 1, V]), sequence i with
    proposals[i] (q: the draft distribution they were drawn from, [k, V]; None: a point mass)."""
    n = len(proposals)
    probs = p.repeat(n, 1)  # [n * (k + 1), V]
    draft_probs = None if q is None else torch.cat([q, q[-1:]]).repeat(n, 1)
    gen = torch.Generator().manual_seed(0)
    _, emitted = accept(Drafts(proposals, [False] * n, [gen] * n), probs.argmax(dim=-1), probs, draft_probs)
    return np.array([e[0] for e in emitted]), np.array([e[1] if len(e) > 1 else -1 for e in emitted])


@pytest.mark.parametrize("proposal", [0, 2, 3])
def test_rejection_sampling_keeps_the_target_distribution_for_a_point_mass_draft(proposal):
    p = torch.tensor([[0.5, 0.1, 0.3, 0.1], [0.25, 0.25, 0.25, 0.25]])
    first, second = draw_first_tokens(p, [[proposal]] * 20000, None)
    assert chisquare(np.bincount(first, minlength=4), p[0].numpy() * len(first)).pvalue > 0.001
    after = second[first == proposal]  # accepted: the bonus token follows, from p[1]
    assert chisquare(np.bincount(after, minlength=4), p[1].numpy() * len(after)).pvalue > 0.001
    assert (second[first != proposal] == -1).all()  # rejected: the correction is the last token


def test_rejection_sampling_keeps_the_target_distribution_for_a_draft_distribution():
    p = torch.tensor([[0.5, 0.1, 0.3, 0.1], [0.1, 0.2, 0.3, 0.4]])
    q = torch.tensor([[0.1, 0.6, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25]])
    proposals = torch.multinomial(q[0], 20000, replacement=True, generator=torch.Generator().manual_seed(1))
    first, _ = draw_first_tokens(p, [[x] for x in proposals.tolist()], q[:1])  # 1: likely under q, not p
    assert chisquare(np.bincount(first, minlength=4), p[0].numpy() * len(first)).pvalue > 0.001


def test_a_seeded_sequence_draws_the_same_whatever_the_batch():
    p = torch.tensor([[0.4, 0.3, 0.2, 0.1]] * 3)
    one = accept(Drafts([[1, 2]], [False], [torch.Generator().manual_seed(5)]), p.argmax(-1), p)
    mixed = accept(Drafts([[0], [1, 2]], [True, False], [None, torch.Generator().manual_seed(5)]),
                   torch.cat([p[:2], p]).argmax(-1), torch.cat([p[:2], p]))
    assert (one[0][0], one[1][0]) == (mixed[0][1], mixed[1][1])


# -- roll-back, inputs, scheduling ------------------------------------------------------------


def sequence(tokens: list[int], computed: int = 0, prompt: int | None = None) -> Sequence:
    seq = Sequence(0, "r", 0, list(tokens), len(tokens) if prompt is None else prompt, SamplingParams())
    seq.num_computed_tokens = computed
    return seq


def test_truncate_returns_the_blocks_of_rejected_tokens():
    pool = BlockPool(8, 4)
    seq = sequence(list(range(10)), computed=9)
    pool.allocate(seq, 1 + 4)  # a verify step: the last token and 4 proposals, positions 9..13
    assert len(seq.block_table) == 4 and pool.num_free_blocks == 4
    seq.num_computed_tokens = 11  # the last token and one proposal accepted
    pool.truncate(seq, 11)
    assert len(seq.block_table) == 3 and pool.num_free_blocks == 5
    assert sum(pool.ref_counts) == 3 and next(iter(pool.free_blocks)) == 3  # reused first
    pool.truncate(seq, 11)  # nothing more to give back
    assert pool.num_free_blocks == 5


def test_a_verify_step_runs_the_proposals_and_returns_logits_at_each():
    decoding = sequence([5, 6, 7, 8, 9], computed=4)
    decoding.block_table = [3, 1]
    decoding.spec_token_ids = [11, 12]
    prefill = sequence([1, 2, 3], computed=0)
    prefill.block_table = [2]
    chunk = sequence([1, 2, 3, 4, 5, 6], computed=0)  # a chunk that does not sample: no proposals run
    chunk.block_table = [0, 4]
    chunk.spec_token_ids = [7]
    host = prepare_step([ScheduledSeq(decoding, 1), ScheduledSeq(prefill, 3), ScheduledSeq(chunk, 4)], 4)
    assert host.input_ids.tolist() == [9, 11, 12, 1, 2, 3, 1, 2, 3, 4]
    assert host.positions.tolist() == [4, 5, 6, 0, 1, 2, 0, 1, 2, 3]
    assert host.slot_mapping.tolist() == [4, 5, 6, 8, 9, 10, 0, 1, 2, 3]
    assert host.seq_lens.tolist() == [7, 3, 4] and host.query_start_loc.tolist() == [0, 3, 6, 10]
    assert host.logits_indices.tolist() == [0, 1, 2, 5]


def running(pool: BlockPool, tokens: int, proposals: list[int], seq_id: int) -> Sequence:
    seq = sequence(list(range(tokens)), prompt=2)
    seq.seq_id, seq.status, seq.spec_token_ids = seq_id, SequenceStatus.RUNNING, list(proposals)
    pool.allocate(seq, tokens - 1)
    seq.num_computed_tokens = tokens - 1
    return seq


def test_the_scheduler_grants_proposals_from_what_the_step_leaves():
    pool = BlockPool(16, 4)
    scheduler = Scheduler(pool, max_num_seqs=8, max_num_batched_tokens=7)
    a, b = running(pool, 4, [1, 2, 3, 4], 0), running(pool, 6, [5, 6, 7], 1)
    scheduler.running = [a, b]
    batch = scheduler.schedule()
    assert [s.num_new_tokens for s in batch] == [1, 1]
    assert a.spec_token_ids == [1, 2, 3, 4] and b.spec_token_ids == [5]  # 7 tokens: 2 + 4 + 1
    assert len(a.block_table) == 2 and len(b.block_table) == 2  # positions up to 7 and 6
    rows = Scheduler(BlockPool(16, 4), max_num_seqs=8, max_num_batched_tokens=64, max_num_logits=3)
    c = running(rows.pool, 4, [1, 2, 3], 0)
    rows.running = [c]
    rows.schedule()
    assert c.spec_token_ids == [1, 2]  # logits rows: 3 at most (a compiled step's limit)
    blocks = Scheduler(BlockPool(2, 4), max_num_seqs=8, max_num_batched_tokens=64)
    d = running(blocks.pool, 7, [1, 2, 3], 0)
    blocks.running = [d]
    blocks.schedule()
    assert d.spec_token_ids == [1] and blocks.num_preemptions == 0  # no block left for more; nobody preempted


# -- metrics --------------------------------------------------------------------------------


def test_stats_and_prometheus_counters():
    stats = SpecDecodeStats()
    stats.record(4, 2)
    stats.record(2, 2)
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (2, 6, 4)
    assert stats.accepted_per_position == [2, 2, 0, 0]
    assert stats.acceptance_rate == pytest.approx(4 / 6) and stats.mean_accepted_length == 3.0
    from graphllm.server.metrics import ServerMetrics

    class Engine:
        def stats(self):
            return EngineStats(1, 0, 10, 12, spec_decode=stats)

    text = ServerMetrics(Engine()).render().decode()
    samples = {s.name + str(sorted(s.labels.items())): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    assert samples["graphllm:spec_decode_num_drafts_total[]"] == 2
    assert samples["graphllm:spec_decode_num_draft_tokens_total[]"] == 6
    assert samples["graphllm:spec_decode_num_accepted_tokens_total[]"] == 4
    assert samples["graphllm:spec_decode_num_accepted_tokens_per_pos_total[('position', '1')]"] == 2
