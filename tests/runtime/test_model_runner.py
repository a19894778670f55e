"""ModelRunner on the eager tiny Llama: logits of the sampled rows equal transformers', the K/V of
every computed token lands in its sequence's slots, the attention op runs under the runner's
backend and only during the step, and queued greedy decode steps give the tokens of single ones."""

import pytest
import torch

from graphllm.ops.attention import active_backend
from graphllm.config import EngineConfig
from graphllm.runtime.sampling_params import SamplingParams
from graphllm.runtime.sequence import Sequence
from graphllm.runtime.setup import build_runtime

PROMPTS = [[1, 5, 9, 17], [1, 42, 43, 44, 45, 46, 47]]
BLOCK_SIZE = 4  # several blocks per prompt: a wrong block table or slot shows in the cache
ATOL = 1e-4


@pytest.fixture
def llama(tiny_model_dir):
    """(model folder, the transformers model)."""
    return tiny_model_dir("llama")


def runtime(path, **options):
    return build_runtime(EngineConfig(model=str(path), dtype="float32", block_size=BLOCK_SIZE, **options))


def add_seqs(rt, prompts) -> list[Sequence]:
    seqs = [Sequence(i, f"r{i}", 0, list(p), len(p), SamplingParams(temperature=0)) for i, p in enumerate(prompts)]
    for seq in seqs:
        rt.scheduler.add(seq)
    return seqs


def run_step(rt, pending_tokens=None):
    """Schedule and execute one step, then mark its tokens computed (as the step loop does)."""
    batch = rt.scheduler.schedule()
    logits = rt.runner.execute(batch, pending_tokens)
    for seq, num_new in batch:
        seq.num_computed_tokens += num_new
    return batch, logits


@torch.no_grad()
def hf_last_logits(hf, tokens) -> torch.Tensor:
    return hf(torch.tensor([tokens])).logits[0, -1]  # [vocab]


def cached_kv(rt, seq, positions) -> torch.Tensor:
    """The cache's K and V of seq at positions: [layers, 2, len(positions), Hkv, D]."""
    slots = [(seq.block_table[p // BLOCK_SIZE], p % BLOCK_SIZE) for p in positions]
    return torch.stack([torch.stack([cache[:, b, o] for b, o in slots], dim=1) for cache in rt.runner.kv_caches])


def test_prefill_then_decode_logits_match_transformers(llama):
    path, hf = llama
    rt = runtime(path)
    seqs = add_seqs(rt, PROMPTS)
    _, logits = run_step(rt)
    assert logits.shape == (2, hf.config.vocab_size)
    for row, seq in zip(logits, seqs):
        torch.testing.assert_close(row, hf_last_logits(hf, seq.token_ids), atol=ATOL, rtol=0)
        seq.append_token(int(row.argmax()))
    _, logits = run_step(rt)  # decode: reads the prefill's K/V back from the cache
    assert logits.shape == (2, hf.config.vocab_size)
    for row, seq in zip(logits, seqs):
        torch.testing.assert_close(row, hf_last_logits(hf, seq.token_ids), atol=ATOL, rtol=0)


def test_prefill_writes_each_tokens_keys_and_values_into_its_slot(llama):
    path, hf = llama
    rt = runtime(path)
    seqs = add_seqs(rt, PROMPTS)
    run_step(rt)
    for seq in seqs:
        with torch.no_grad():
            layers = hf(torch.tensor([seq.token_ids]), use_cache=True).past_key_values.layers
        expected = torch.stack([torch.stack([layer.keys[0], layer.values[0]]).transpose(1, 2)
                                for layer in layers])  # [layers, 2, S, Hkv, D]
        torch.testing.assert_close(cached_kv(rt, seq, range(seq.num_tokens)), expected, atol=ATOL, rtol=0)
    used = {b for seq in seqs for b in seq.block_table}
    unused = [b for b in range(rt.state.num_kv_blocks + 1) if b not in used]
    assert all(cache[:, unused].abs().sum() == 0 for cache in rt.runner.kv_caches)  # no stray writes


def test_only_sequences_that_sample_get_a_logits_row(llama):
    """A prompt split over two steps (chunked prefill) has no row until its last chunk."""
    path, hf = llama
    rt = runtime(path, max_num_batched_tokens=6)
    short, long = add_seqs(rt, PROMPTS)
    batch, logits = run_step(rt)
    assert [s.num_new_tokens for s in batch] == [4, 2]
    assert logits.shape == (1, hf.config.vocab_size)  # the short prompt's row only
    torch.testing.assert_close(logits[0], hf_last_logits(hf, short.token_ids), atol=ATOL, rtol=0)
    short.append_token(int(logits[0].argmax()))
    batch, logits = run_step(rt)  # the short one decodes, the long one finishes its prompt
    assert [s.num_new_tokens for s in batch] == [1, 5] and logits.shape[0] == 2
    for row, seq in zip(logits, (short, long)):
        torch.testing.assert_close(row, hf_last_logits(hf, seq.token_ids), atol=ATOL, rtol=0)


def test_pending_input_token_is_read_from_the_step_in_flight(llama):
    """Async scheduling: the decode input is row `pending_row` of the previous step's tokens."""
    path, hf = llama
    rt = runtime(path)
    (seq,) = add_seqs(rt, PROMPTS[:1])
    _, logits = run_step(rt)
    token = int(logits[0].argmax())
    seq.append_pending(row=1)
    _, logits = run_step(rt, pending_tokens=torch.tensor([token + 1, token]))
    torch.testing.assert_close(logits[0], hf_last_logits(hf, PROMPTS[0] + [token]), atol=ATOL, rtol=0)


def test_the_step_runs_under_the_runners_backend_and_only_during_it(llama):
    rt = runtime(llama[0])
    add_seqs(rt, PROMPTS)
    step, seen = rt.runner.step, []

    def watched(*inputs):
        seen.append(active_backend())
        return step(*inputs)

    rt.runner.step = watched
    run_step(rt)
    assert seen == [rt.runner.backend]
    with pytest.raises(RuntimeError, match="outside an attention backend's scope"):
        active_backend()

    def failing(*inputs):
        raise ValueError("step failed")

    rt.runner.step = failing
    with pytest.raises(ValueError, match="step failed"):
        rt.runner.execute(rt.scheduler.schedule())
    with pytest.raises(RuntimeError, match="outside an attention backend's scope"):
        active_backend()  # the scope ended with the error too


def test_decode_steps_give_the_tokens_and_cache_of_single_greedy_steps(llama):
    path, hf = llama
    num_steps = 5
    burst, single = runtime(path), runtime(path)
    for rt in (burst, single):
        seqs = add_seqs(rt, PROMPTS)
        _, logits = run_step(rt)
        for row, seq in zip(logits, seqs):
            seq.append_token(int(row.argmax()))
    batch = burst.scheduler.schedule()
    for s in batch:
        burst.pool.allocate(s.seq, num_steps)
    seen = []
    step = burst.runner.step
    burst.runner.step = lambda *inputs: seen.append(active_backend()) or step(*inputs)
    tokens = burst.runner.execute_decode_steps(batch, num_steps)  # [step][row]
    assert len(tokens) == num_steps and seen == [burst.runner.backend] * num_steps
    expected = []
    for _ in range(num_steps):
        batch, logits = run_step(single)
        expected.append(logits.argmax(dim=-1).tolist())
        for s, token in zip(batch, expected[-1]):
            s.seq.append_token(token)
    assert tokens == expected
    for i, prompt in enumerate(PROMPTS):
        with torch.no_grad():
            reference = hf.generate(torch.tensor([prompt]), max_new_tokens=num_steps + 1, do_sample=False,
                                    eos_token_id=None, pad_token_id=0)[0, len(prompt) + 1:].tolist()
        assert [row[i] for row in tokens] == reference
        # every queued step wrote its input token's K/V, as the single steps did
        written = range(len(prompt) + num_steps)
        torch.testing.assert_close(cached_kv(burst, burst.scheduler.running[i], written),
                                   cached_kv(single, single.scheduler.running[i], written), atol=ATOL, rtol=0)
