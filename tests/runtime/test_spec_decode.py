"""Speculative decoding end to end on tiny random Llamas (CPU, float32): it must change how many target
steps a request takes, never what comes out. Greedy outputs (tokens, text, stops, logprobs) equal a plain
engine's for both proposers and k in 1, 2, 4, under preemption and prefix caching; sampled outputs follow
the target's distribution (chi-square against the model's exact probabilities). Every engine runs float32, on
a GPU too (dtype auto would be bfloat16 there, and the compiled artifacts and the oracle are float32)."""

import json
import math
import shutil

import pytest
import torch
import transformers
from scipy.stats import chisquare

from graphllm import Engine, SamplingParams
from tests.conftest import TEST_CACHE_DIR
from tests.tiny_models import COMMON, make_hf_model, make_tokenizer, save_model_folder

# repeated n-grams (prompt lookup finds them) and prompts of other lengths
PROMPTS = [[1, 5, 9, 17, 5, 9, 17, 5], [1, 42, 43], [1, 60, 61, 62, 63, 64, 60, 61], [1, 7, 7, 7, 7]]
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
MIXED = [GREEDY,
         SamplingParams(temperature=0, max_tokens=17, logprobs=2, ignore_eos=True),
         SamplingParams(temperature=0, max_tokens=20, repetition_penalty=1.5, presence_penalty=0.5, ignore_eos=True),
         SamplingParams(temperature=0, max_tokens=19, min_tokens=6, stop=["w118"], frequency_penalty=0.3)]
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}


@pytest.fixture(scope="module")
def llama(tiny_model_dir):
    return tiny_model_dir("llama")


@pytest.fixture(scope="module")
def other_draft(tmp_path_factory):
    """A second tiny Llama (other weights) with the target's tokenizer: its proposals are mostly rejected."""
    return str(save_model_folder(make_hf_model("llama", seed=1), tmp_path_factory.mktemp("draft")))


@pytest.fixture(scope="module")
def plain(llama):
    return Engine.from_pretrained(llama[0], dtype="float32")


def spec_engine(path, speculative_config, **options) -> Engine:
    return Engine.from_pretrained(path, speculative_config=speculative_config, **{"dtype": "float32", **options})


def run(engine: Engine, prompts, params) -> list:
    """Everything the outputs hold; every block back in the pool afterwards."""
    outs = engine.generate(prompts, params)
    assert not engine.has_unfinished_requests()
    assert engine.pool.num_free_blocks == engine.pool.num_blocks and sum(engine.pool.ref_counts) == 0
    return [(list(c.token_ids), c.text, c.finish_reason, c.stop_reason, c.logprobs) for o in outs for c in o.outputs]


def assert_same(got: list, want: list) -> None:
    for (tokens, text, reason, stop, logprobs), (tokens2, text2, reason2, stop2, logprobs2) in zip(got, want):
        assert (tokens, text, reason, stop) == (tokens2, text2, reason2, stop2)
        assert (logprobs is None) == (logprobs2 is None)
        for entry, entry2 in zip(logprobs or [], logprobs2 or []):
            assert entry.keys() == entry2.keys()
            for token, lp in entry.items():
                assert (lp.rank, lp.decoded_token) == (entry2[token].rank, entry2[token].decoded_token)
                assert lp.logprob == pytest.approx(entry2[token].logprob, abs=1e-4)
    assert len(got) == len(want)


def config_of(proposer: str, k: int, llama, other_draft) -> dict:
    if proposer == "ngram":
        return {**NGRAM, "num_speculative_tokens": k}
    return {"model": str(llama[0]) if proposer == "draft-self" else other_draft, "num_speculative_tokens": k}


# the target as its own draft (all plain-greedy proposals accepted); another model (nearly all rejected)
@pytest.mark.parametrize("proposer, k", [("ngram", 1), ("ngram", 2), ("ngram", 4), ("draft-self", 1),
                                         ("draft-self", 2), ("draft-self", 4), ("draft-other", 2)])
def test_greedy_outputs_equal_plain_decoding(llama, other_draft, plain, proposer, k):
    engine = spec_engine(llama[0], config_of(proposer, k, llama, other_draft))
    assert_same(run(engine, PROMPTS, MIXED), run(plain, PROMPTS, MIXED))
    stats = engine.stats().spec_decode
    assert stats.num_drafts > 0 and stats.num_draft_tokens <= k * stats.num_drafts
    assert 0 < stats.num_accepted_tokens <= stats.num_draft_tokens or proposer == "draft-other"
    assert stats.draft_seconds > 0 and stats.verify_seconds > 0
    if proposer == "draft-self":  # plain greedy rows take its own argmax: all accepted, k + 1 tokens a step
        run(engine, PROMPTS, GREEDY)
        after = engine.stats().spec_decode
        drafts, accepted = after.num_drafts - stats.num_drafts, after.num_accepted_tokens - stats.num_accepted_tokens
        assert accepted > 0.95 * (after.num_draft_tokens - stats.num_draft_tokens) and accepted / drafts > 0.85 * k


@pytest.mark.parametrize("proposer", ["ngram", "draft-self"])
def test_preemption_with_a_small_kv_pool(llama, other_draft, proposer):
    # 7 blocks of 8 tokens for 4 sequences growing to ~26 tokens, an 8-token budget: preemption, chunked
    # prefill, and proposals cut to what the budget leaves
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    options = dict(num_kv_blocks=7, block_size=8, max_num_batched_tokens=8, max_num_seqs=4, max_model_len=56)
    engine = spec_engine(llama[0], config_of(proposer, 4, llama, other_draft), **options)
    plain_engine = Engine.from_pretrained(llama[0], dtype="float32", **options)
    assert_same(run(engine, PROMPTS, params), run(plain_engine, PROMPTS, params))
    assert engine.scheduler.num_preemptions > 0
    assert engine.stats().spec_decode.num_accepted_tokens > 0


def test_prefix_caching_keys_only_accepted_tokens(llama, plain):
    # 4-token blocks fill up inside verify steps; a second request whose prompt is the first one's prompt and
    # output hits the blocks registered while decoding, which must hold the accepted tokens' K/V
    engine = spec_engine(llama[0], {"model": str(llama[0]), "num_speculative_tokens": 3}, block_size=4)
    first = run(engine, PROMPTS, GREEDY)
    assert_same(first, run(plain, PROMPTS, GREEDY))
    followups = [prompt + out[0][:14] for prompt, out in zip(PROMPTS, first)]
    hits = engine.pool.prefix_cache_hits
    outs = engine.generate(followups, GREEDY)
    assert_same(run(plain, followups, GREEDY), [(list(c.token_ids), c.text, c.finish_reason, c.stop_reason, None)
                                                for o in outs for c in o.outputs])
    assert all(o.num_cached_tokens > len(p) for o, p in zip(outs, PROMPTS))  # past the prompt: decoded blocks
    assert engine.pool.prefix_cache_hits > hits
    ngram = spec_engine(llama[0], NGRAM, block_size=4)  # and with rejections (n-gram guesses)
    assert_same(run(ngram, PROMPTS + followups, GREEDY), run(plain, PROMPTS + followups, GREEDY))


def test_blocks_held_cover_only_computed_tokens_after_every_step(llama):
    # after each verify step the blocks of rejected positions are back in the pool: a sequence holds what
    # its computed tokens need, as after a plain step
    engine = spec_engine(llama[0], NGRAM, block_size=4)
    for prompt in PROMPTS:
        engine.add_request(prompt, GREEDY)
    while engine.has_unfinished_requests():
        engine.step()
        held = set()
        for seq in engine.scheduler.running:
            assert len(seq.block_table) == -(-seq.num_computed_tokens // 4)
            held |= set(seq.block_table)
        assert engine.pool.num_free_blocks == engine.pool.num_blocks - len(held)
    assert 0 < engine.stats().spec_decode.num_accepted_tokens < engine.stats().spec_decode.num_draft_tokens


def test_stops_inside_an_accepted_run(llama, plain, tmp_path):
    # the target is its own draft with k = 4: after the prefill's token, each verify step emits tokens 1-5,
    # 6-10, ...; every stop below falls inside such a run, and the tokens after it must go
    reference = run(plain, [PROMPTS[1]], GREEDY)[0][0]
    at = next(i for i in range(2, 5) if reference[i] not in reference[:i])
    draft = {"model": str(llama[0]), "num_speculative_tokens": 4}
    engine = spec_engine(llama[0], draft)
    words = run(plain, [PROMPTS[1]], GREEDY)[0][1].split()
    for params in (SamplingParams(temperature=0, max_tokens=24, stop_token_ids=[reference[at]]),
                   SamplingParams(temperature=0, max_tokens=24, stop=[f"{words[at - 1]} {words[at][:2]}"],
                                  ignore_eos=True),
                   SamplingParams(temperature=0, max_tokens=at + 1, ignore_eos=True)):
        got = run(engine, [PROMPTS[1]], params)
        assert_same(got, run(plain, [PROMPTS[1]], params))
        assert len(got[0][0]) <= at + 1 and got[0][2] in ("stop", "length")
    assert engine.stats().spec_decode.num_accepted_tokens >= 3 * 3
    # EOS: a folder whose generation_config names the token at `at` as EOS
    eos_dir = tmp_path / "eos"
    shutil.copytree(llama[0], eos_dir)
    (eos_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, reference[at]]}))
    params = SamplingParams(temperature=0, max_tokens=24)
    got = run(spec_engine(eos_dir, {"model": str(eos_dir), "num_speculative_tokens": 4}), [PROMPTS[1]], params)
    assert got == run(Engine.from_pretrained(eos_dir, dtype="float32"), [PROMPTS[1]], params)
    assert got[0][0] == reference[:at + 1] and got[0][2] == "stop"


def test_seeded_sampling_is_reproducible(llama):
    engine = spec_engine(llama[0], NGRAM)
    seeded = SamplingParams(temperature=0.9, top_p=0.95, seed=7, max_tokens=24, ignore_eos=True)
    alone = run(engine, [PROMPTS[0]], seeded)
    other = SamplingParams(temperature=1.0, max_tokens=24, ignore_eos=True)
    assert run(engine, PROMPTS[:3], [seeded, other, other])[0] == alone[0]
    assert run(spec_engine(llama[0], NGRAM), [PROMPTS[0]], seeded) == alone
    assert run(engine, [PROMPTS[0]], SamplingParams(temperature=0.9, top_p=0.95, seed=8, max_tokens=24,
                                                     ignore_eos=True)) != alone


def exact_probabilities(hf, prompt: list[int], length: int, top_k: int) -> dict[tuple[int, ...], float]:
    """P(first `length` tokens) under temperature 1 and top_k, from the transformers model itself."""
    probs = {(): 1.0}
    for _ in range(length):
        prefixes = list(probs)
        with torch.no_grad():
            logits = hf(torch.tensor([prompt + list(p) for p in prefixes])).logits[:, -1].double()  # [P, V]
        top, ids = logits.topk(top_k, dim=-1)
        step = top.softmax(dim=-1)
        probs = {p + (t,): probs[p] * q for p, row_ids, row in zip(prefixes, ids.tolist(), step.tolist())
                 for t, q in zip(row_ids, row)}
    return probs


def test_sampling_follows_the_target_distribution(llama):
    # top-k 2 over 4 tokens: 16 outcomes, each of >= ~0.5% probability. The draft is the target itself
    # (greedy proposals, each accepted with p(argmax) < 1): acceptances, rejections and bonus tokens all
    # happen. Over 1000 seeds the counts must fit the model's exact probabilities.
    path, hf = llama
    prompt, length, n = PROMPTS[2], 4, 1000
    params = [SamplingParams(temperature=1.0, top_k=2, seed=seed, max_tokens=length, ignore_eos=True)
              for seed in range(n)]
    engine = spec_engine(path, {"model": str(path), "num_speculative_tokens": 2},
                         max_num_seqs=256, max_num_batched_tokens=4096)
    outs = engine.generate([prompt] * n, params)
    counts: dict[tuple, int] = {}
    for o in outs:
        key = tuple(o.outputs[0].token_ids)
        counts[key] = counts.get(key, 0) + 1
    expected = exact_probabilities(hf, prompt, length, top_k=2)
    assert set(counts) <= set(expected)
    cells = sorted(expected)
    observed = [counts.get(c, 0) for c in cells]
    want = [expected[c] * n for c in cells]
    assert min(want) >= 5 and math.isclose(sum(want), n)
    assert chisquare(observed, want).pvalue > 0.001
    stats = engine.stats().spec_decode
    assert 0.2 < stats.acceptance_rate < 0.95  # both branches taken


def test_refusals(llama, tmp_path):
    path = llama[0]
    # a draft with another vocabulary size
    small = transformers.LlamaConfig(**{**COMMON, "vocab_size": 96})
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(small).save_pretrained(tmp_path / "v96")
    with pytest.raises(ValueError, match="vocab_size 96 differs from the target's 128"):
        spec_engine(path, {"model": str(tmp_path / "v96"), "num_speculative_tokens": 2})
    # the same size, another tokenizer (two words swapped)
    make_hf_model("llama", seed=2).save_pretrained(tmp_path / "swapped")
    tok = make_tokenizer()
    vocab = tok.get_vocab()
    swapped = {**vocab, "w0": vocab["w1"], "w1": vocab["w0"]}
    from tokenizers import Tokenizer, models, pre_tokenizers
    backend = Tokenizer(models.WordLevel(swapped, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    transformers.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>",
                                         eos_token="</s>").save_pretrained(tmp_path / "swapped")
    with pytest.raises(ValueError, match="its tokenizer differs from the target's .2 tokens"):
        spec_engine(path, {"model": str(tmp_path / "swapped"), "num_speculative_tokens": 2})
    # num_decode_steps > 1
    with pytest.raises(ValueError, match="num_decode_steps"):
        spec_engine(path, NGRAM, num_decode_steps=4)


def test_speculative_engines_run_synchronously(llama):
    assert Engine.from_pretrained(llama[0]).async_scheduling
    assert not spec_engine(llama[0], NGRAM).async_scheduling


def test_a_compiled_artifact_verifies_too(llama, compiled_dir, plain):
    engine = Engine.load(compiled_dir("llama"), speculative_config=NGRAM)
    assert engine.model is None  # the artifact's step runs the verify steps
    assert_same(run(engine, PROMPTS, MIXED), run(plain, PROMPTS, MIXED))
    assert engine.stats().spec_decode.num_accepted_tokens > 0


def test_a_compiled_step_returns_a_logits_row_per_token(llama, compiled_dir, plain):
    """Verify steps sample k + 1 rows per sequence: 16 sequences with 4 proposals each need 80 rows, more than
    the artifact's max_num_seqs (64), which once bounded them and cut the proposals short."""
    engine = Engine.load(compiled_dir("llama"), speculative_config={"model": str(llama[0]), "num_speculative_tokens": 4},
                         cache_dir=TEST_CACHE_DIR)
    assert engine.state.limits.max_num_seqs == 64 and engine.scheduler.max_num_logits >= 80
    assert engine.spec_decoder.proposer.compiled  # a compiled target's draft is compiled too
    prompts = [[1, 3 + i, 7, 9 + i] for i in range(16)]
    assert_same(run(engine, prompts, GREEDY), run(plain, prompts, GREEDY))
    stats = engine.stats().spec_decode
    assert stats.num_draft_tokens / stats.num_drafts > 3.5  # whole proposals granted (at most 3 under 64 rows)


def test_argmax_verification_on_the_host_accepts_what_the_device_path_accepts(llama, monkeypatch):
    """A step of argmax-only sequences reads the argmax back once and accepts on the host (_verify_argmax); the
    general path (rejection_sampler.accept on the device) must emit the same tokens and accept the same counts.
    n-gram guesses on these prompts are partly wrong, so both acceptance and rejection are exercised."""
    from graphllm.runtime.spec_decode.decoder import SpeculativeDecoder

    def outcome(engine):
        tokens = run(engine, PROMPTS, GREEDY)
        s = engine.stats().spec_decode
        return tokens, (s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens, list(s.accepted_per_position))

    host_path = spec_engine(llama[0], NGRAM)
    calls = []
    monkeypatch.setattr(SpeculativeDecoder, "_verify", lambda self, *a: calls.append(a))
    host = outcome(host_path)
    assert not calls  # every step took the host path
    monkeypatch.undo()
    monkeypatch.setattr(SpeculativeDecoder, "_argmax_only", lambda self, seq: False)
    device = outcome(spec_engine(llama[0], NGRAM))
    assert host[0] == device[0] and host[1] == device[1]
    assert 0 < host[1][2] < host[1][1]  # some proposals accepted, some rejected
