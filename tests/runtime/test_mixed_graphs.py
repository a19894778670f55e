"""cudagraph_mode FULL's padding on CPU: a step with prompt tokens padded to a mixed-graph bucket (inputs.pad_mixed)
computes the unpadded step's logits and K/V for its real rows, through the eager step and a compiled artifact
(which takes one sequence beyond max_num_seqs for it); bucket choice, staging and an engine's steps through the
runner (MixedGraphRunner, its StepReplay in place of graphs) without a GPU. The graphs themselves are
tests/gpu/test_mixed_graphs.py's."""

import numpy as np
import pytest
import torch

from graphllm.backends import TorchBackend
from graphllm.config import EngineConfig, mixed_token_buckets
from graphllm.ir.capture import StepModule
from graphllm.models.loader import load_model
from graphllm.ops.attention import use_backend
from graphllm.runtime.inputs import HostStep, pad_mixed, prepare_step
from graphllm.runtime.kv_cache import allocate_kv_caches
from graphllm.runtime.mixed_graphs import MixedGraphRunner
from graphllm.runtime.sampling_params import SamplingParams
from graphllm.runtime.scheduler import ScheduledSeq
from tests.gpu.helpers import transformers_greedy
from tests.runtime.test_inputs import seq

BLOCK, BLOCKS, MAX_BLOCKS = 16, 12, 4  # cache blocks 0..11 for sequences, block 12 for padding


def cached_then_mixed() -> tuple[HostStep, HostStep]:
    """A prefill that caches two prefixes, then a mixed step: a decode, a chunk that does not sample, a prompt."""
    decode, chunk = list(range(10, 30)), list(range(40, 80))
    first = prepare_step([ScheduledSeq(seq(decode, 0, [7, 3]), 19), ScheduledSeq(seq(chunk, 0, [5, 9, 2]), 16)], BLOCK)
    mixed = prepare_step([ScheduledSeq(seq(decode, 19, [7, 3]), 1), ScheduledSeq(seq(chunk, 16, [5, 9, 2]), 6),
                          ScheduledSeq(seq(range(90, 95), 0, [8]), 5)], BLOCK)
    return first, mixed


def run(step, host: HostStep, caches, backend) -> torch.Tensor:
    inputs = host.to_device(caches, torch.device("cpu"))
    with use_backend(backend):
        return step(*inputs.flat())


def check_padded_step(step, config, backend, tokens: int, seqs: int, dtype=torch.float32):
    """The padded mixed step's first rows of logits and every real K/V slot equal the unpadded step's; padding
    writes the padding block alone."""
    first, mixed = cached_then_mixed()
    caches = allocate_kv_caches(config, BLOCKS + 1, BLOCK, dtype, torch.device("cpu"))
    run(step, first, caches, backend)
    padded = pad_mixed(mixed, tokens, seqs, BLOCKS, BLOCK, MAX_BLOCKS)
    assert padded is not None
    plain_caches, padded_caches = [c.clone() for c in caches], [c.clone() for c in caches]
    expected = run(step, mixed, plain_caches, backend)
    got = run(step, padded, padded_caches, backend)
    assert got.shape[0] == seqs and torch.allclose(got[:len(mixed.logits_indices)], expected, atol=1e-5, rtol=1e-5)
    for plain, pad in zip(plain_caches, padded_caches):
        assert torch.equal(plain[:, :BLOCKS], pad[:, :BLOCKS])  # the padding block (index BLOCKS) may differ
        assert torch.isfinite(pad).all()


def test_pad_mixed_fields():
    _, mixed = cached_then_mixed()  # 12 tokens of 3 sequences, 2 logits rows
    padded = pad_mixed(mixed, 40, 6, BLOCKS, BLOCK, MAX_BLOCKS)
    assert padded.input_ids[:12].tolist() == mixed.input_ids.tolist() and not padded.input_ids[12:].any()
    assert padded.query_start_loc.tolist() == [0, 1, 7, 12, 40, 40, 40]  # one padding sequence holds 28 tokens
    assert padded.seq_lens.tolist() == [20, 22, 5, 28, 0, 0]
    assert padded.positions[12:].tolist() == list(range(28))
    assert padded.slot_mapping[12:].tolist() == [BLOCKS * BLOCK + p % BLOCK for p in range(28)]
    assert padded.block_tables.tolist()[:3] == [[7, 3, 0, 0], [5, 9, 2, 0], [8, 0, 0, 0]]
    assert (padded.block_tables[3:] == BLOCKS).all()
    assert padded.logits_indices.tolist() == [0, 11, 39, 39, 39, 39]  # the real rows first
    spread = pad_mixed(mixed, 12 + 3 * MAX_BLOCKS * BLOCK, 6, BLOCKS, BLOCK, MAX_BLOCKS)  # 192 padding tokens
    assert spread.seq_lens.tolist()[3:] == [64, 64, 64]  # a sequence holds max_blocks pages at most


@pytest.mark.parametrize("tokens, seqs, why", [(11, 6, "fewer tokens than the step"), (40, 2, "fewer sequences"),
                                               (40, 3, "no padding sequence for the padding tokens"),
                                               (12 + 3 * MAX_BLOCKS * BLOCK + 1, 6, "more than 3 can hold"),
                                               (6, 6, "as many sequences as tokens: a decode's shape")])
def test_pad_mixed_refuses_what_does_not_fit(tokens, seqs, why):
    _, mixed = cached_then_mixed()
    assert pad_mixed(mixed, tokens, seqs, BLOCKS, BLOCK, MAX_BLOCKS) is None, why
    assert pad_mixed(mixed, 12, 3, BLOCKS, BLOCK, MAX_BLOCKS) is not None  # exactly the step's shape


def test_padded_step_computes_the_unpadded_rows_eagerly(tiny_model_dir):
    path, _ = tiny_model_dir("llama")
    model, config = load_model(path)
    check_padded_step(StepModule(model), config, TorchBackend(), tokens=40, seqs=6)
    check_padded_step(StepModule(model), config, TorchBackend(), tokens=12 + 2 * MAX_BLOCKS * BLOCK, seqs=6)


@pytest.mark.skipif(torch.cuda.is_available(), reason="compiled_dir compiles for the GPU there (tests/gpu runs it)")
def test_compiled_step_takes_one_sequence_beyond_max_num_seqs(compiled_dir):
    """A full batch pads with a sequence of its own: the artifact's step takes max_num_seqs + 1 sequences."""
    from graphllm.compiler.artifact import verify_artifact
    from graphllm.compiler.loading import load_compiled_step
    art = compiled_dir("llama")
    manifest = verify_artifact(art, torch.device("cpu"))
    seqs = manifest["compile"]["max_num_seqs"] + 1
    assert manifest["compile"]["max_num_graph_seqs"] == seqs
    config, _, step = load_compiled_step(art, manifest, torch.device("cpu"))
    check_padded_step(step, config, TorchBackend(), tokens=80, seqs=seqs)  # 3 real sequences, the rest padding


def runner(buckets=(16, 32, 64), max_seqs=5) -> MixedGraphRunner:
    return MixedGraphRunner(None, [], buckets, max_seqs, MAX_BLOCKS, BLOCKS, BLOCK, torch.device("cpu"),
                            TorchBackend())


def test_bucket_for_takes_the_smallest_bucket_that_holds_the_step():
    r = runner()
    first, mixed = cached_then_mixed()
    assert r.seqs == {16: 5, 32: 5, 64: 5}
    bucket, padded = r.bucket_for(mixed)
    assert bucket == 16 and len(padded.input_ids) == 16 and padded.num_seqs == 5
    assert r.bucket_for(first)[0] == 64  # 35 tokens
    decode = prepare_step([ScheduledSeq(seq(range(20), 19, [7, 3]), 1)], BLOCK)
    assert r.bucket_for(decode) is None  # decode steps replay the decode graphs
    verify = mixed._replace(logits_indices=np.arange(12))
    assert r.bucket_for(verify) is None  # more logits rows than sequences: a verify step
    assert runner(buckets=(8,)).bucket_for(mixed) is None  # larger than every bucket
    assert runner(max_seqs=3).bucket_for(mixed) is None  # no room for a padding sequence beside 3
    assert runner(buckets=(12, 16), max_seqs=3).bucket_for(mixed)[0] == 12  # none needed: the step's own shape


def test_stage_writes_the_padded_step_into_the_static_inputs():
    r = runner()
    _, mixed = cached_then_mixed()
    bucket, padded = r.bucket_for(mixed)
    r.stage(padded, slot=1)
    got = [t.numpy() for t in r.static_inputs(bucket)[:-1]]
    for field, want in zip(got, padded):
        assert np.array_equal(field, want)


def test_token_buckets():
    assert mixed_token_buckets(2048) == (32, 64, 128, 256, 384, 512, 640, 768, 896, 1024, 1280, 1536, 1792, 2048)
    assert mixed_token_buckets(100) == (32, 64, 100)
    with pytest.raises(ValueError, match="cudagraph_mode"):
        EngineConfig(cudagraph_mode="PIECEWISE")
    with pytest.raises(ValueError, match="max_cudagraph_capture_size"):
        EngineConfig(max_cudagraph_capture_size=1)


PROMPTS = [[1, 5, 9, 17, 33], [1, 42], list(range(3, 40)), list(range(50, 71)), [7] * 12, list(range(90, 99))]
LENGTHS = (12, 7, 10, 9, 5, 11)


def run_arrivals(engine) -> list[list[int]]:
    """Two prompts, then one more every third step while the others decode: mixed steps of every kind."""
    ids, finished, waiting = [], {}, list(zip(PROMPTS, LENGTHS))
    for step in range(400):
        if waiting and (step < 2 or step % 3 == 0):
            prompt, n = waiting.pop(0)
            ids.append(engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)))
        finished.update((o.request_id, o) for o in engine.step() if o.finished)
        if not waiting and not engine.has_unfinished_requests():
            break
    return [finished[i].outputs[0].token_ids for i in ids]


@pytest.mark.parametrize("arch, async_scheduling", [("llama", True), ("llama", False), ("gemma2", True)])
def test_engine_runs_prompt_steps_through_the_mixed_runner_with_the_same_tokens(arch, async_scheduling,
                                                                                tiny_model_dir):
    """The runner's staging, padding (full batches: the sequence beyond max_num_seqs), device-side input ids of
    the step in flight and logits rows, end to end on CPU (StepReplay in place of graphs): the plain engine's
    greedy tokens, which are transformers' (Gemma 2: per-layer windows, the soft caps, and a prompt one token
    longer than its window, where transformers 5.17 and 5.24 differ: tests/gpu/test_mixed_graphs.py)."""
    from graphllm import Engine
    path, hf = tiny_model_dir(arch)
    options = dict(dtype="float32", max_num_batched_tokens=16, max_num_seqs=4, async_scheduling=async_scheduling)
    expected = run_arrivals(Engine.from_pretrained(path, **options))
    if arch == "gemma2":
        assert expected == [e[:n] for e, n in zip(transformers_greedy(hf, PROMPTS, max(LENGTHS), "cpu"), LENGTHS)]
    engine = Engine.from_pretrained(path, **options)
    state, inner = engine.state, engine.runner
    mixed = MixedGraphRunner(inner.step, inner.kv_caches, (8, 16), 5, -(-state.max_model_len // BLOCK),
                             state.num_kv_blocks, state.limits.block_size, state.device, inner.backend)
    mixed.capture()
    assert mixed.buckets == (8, 16) and mixed.logits.shape == (5, state.model_config.vocab_size)
    inner.mixed_graphs, seen, run = mixed, [], mixed.run
    mixed.run = lambda host, fill=None: seen.append((len(host.input_ids), host.num_seqs, fill is not None)) or \
        run(host, fill)
    assert run_arrivals(engine) == expected
    assert mixed.replays == len(seen) > 0
    assert any(seqs == 4 for _, seqs, _ in seen)  # a full batch, padded with a fifth sequence
    assert any(tokens not in (8, 16) for tokens, _, _ in seen)  # padded up to its bucket
    assert any(pending for _, _, pending in seen) == async_scheduling  # decode rows' tokens still on the device
    assert engine.pool.num_free_blocks == engine.pool.num_blocks
