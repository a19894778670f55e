"""SpeculativeDecoder: proposals before a step, their verification and roll-back after it.

    before the step   propose(running): each decoding sequence gets up to k proposed tokens in
                      seq.spec_token_ids (k capped so that the run cannot pass max_tokens or max_model_len);
                      the scheduler keeps those that fit the step (scheduler._grant_spec_tokens)
    the step          the target runs each sequence's last token plus its proposals, k + 1 query tokens over
                      its cached context: the chunked-prefill path of the runner (inputs.prepare_step), with
                      logits at all k + 1 positions. Verify steps run un-graphed (the decode CUDA graphs take
                      one token per sequence); steps without proposals still replay them.
    after the step    verify(logits, seqs): per position, the request's own processing (penalties, min_tokens,
                      temperature, top-k/top-p/min-p: the sampler's functions, with the output as it stands at
                      that position), then acceptance (rejection_sampler.py). Tokens are appended one by one
                      with the usual stop checks, so EOS, stop ids, stop strings and max_tokens end a run just
                      where plain decoding would; the tokens after are dropped. Logprobs are the same as plain
                      decoding reports (the raw logits' log_softmax at each token's position). When every
                      sequence of the step takes the raw argmax at every row (greedy, no logprobs, penalties,
                      grammar or pending min_tokens) the rows' argmax is read back once and acceptance runs on
                      the host (_verify_argmax): the same tokens, without the small kernels and syncs.
    roll-back         num_computed_tokens counts the last input and the accepted proposals only; the blocks
                      past them go back to the pool (BlockPool.truncate). The K/V written for rejected tokens
                      lies past num_computed_tokens, where it is overwritten before it is read, and prefix
                      caching keys only blocks of computed (accepted) tokens.

Structured outputs: before acceptance, row j of a sequence with a live grammar is masked by its grammar as it
stands after the proposals before j (StructuredOutputManager.constrain_drafts: the matcher walks the proposals
and is rolled back), so a proposal the grammar forbids is rejected and every emitted token obeys the grammar.
The emitted tokens are then accepted by the matcher one by one, as sampled ones are. A grammar that opens
inside the run (a reasoning model's reasoning_end) ends the run there: the rows after it were not masked.
"""

import time

import torch

from graphllm.runtime.kv_cache import BlockPool
from graphllm.runtime.postprocess import PostProcessor
from graphllm.runtime.sampler import (SamplingRow, _has_penalty, apply_min_tokens, apply_penalties,
                                      compute_raw_logprobs, gather_logprobs, plain_greedy, sampling_probs)
from graphllm.runtime.sequence import Sequence
from graphllm.runtime.structured_output import grammar_live
from graphllm.speculative_config import SpeculativeConfig
from graphllm.runtime.spec_decode.rejection_sampler import Drafts, accept
from graphllm.runtime.spec_decode.stats import SpecDecodeStats


class SpeculativeDecoder:
    def __init__(self, config: SpeculativeConfig, proposer, pool: BlockPool, post: PostProcessor,
                 max_model_len: int):
        self.config, self.proposer, self.pool, self.post = config, proposer, pool, post
        self.max_model_len = max_model_len
        self.stats = SpecDecodeStats()

    # -- proposing --------------------------------------------------------------------------

    def propose(self, running: list[Sequence]) -> None:
        """Set the proposals of every running sequence that decodes next (none for the others)."""
        start = time.perf_counter()
        self.proposer.release_finished()
        seqs, ks = [], []
        for seq in running:
            seq.spec_token_ids = []
            k = self.num_proposals(seq)
            if k > 0:
                seqs.append(seq)
                ks.append(k)
        if not seqs:
            return
        for seq, tokens in zip(seqs, self.proposer.propose(seqs, ks)):
            seq.spec_token_ids = tokens
        self.stats.draft_seconds += time.perf_counter() - start

    def num_proposals(self, seq: Sequence) -> int:
        """k for a decoding sequence, less where the k + 1 tokens of a verify step would pass its max_tokens
        or max_model_len (or the draft model's positions); 0 for one still in prefill."""
        if seq.num_uncomputed_tokens != 1 or seq.pending_row is not None or seq.stopping:
            return 0
        k = min(self.config.num_speculative_tokens, self.max_model_len - seq.num_tokens - 1)
        if seq.params.max_tokens is not None:
            k = min(k, seq.params.max_tokens - seq.num_output_tokens - 1)
        if self.proposer.max_model_len is not None:
            k = min(k, self.proposer.max_model_len - seq.num_tokens - 1)
        return max(k, 0)

    # -- verifying --------------------------------------------------------------------------

    def verify(self, logits: torch.Tensor, seqs: list[Sequence], since: float) -> None:
        """Turn a step's logits into tokens for seqs (its sampling sequences, in batch order): 1 + k rows
        each, k = len(seq.spec_token_ids). Sequences without proposals are sampled as usual. since: when
        the step began (verify time counts from there)."""
        offsets, row = [], 0
        for seq in seqs:
            offsets.append(row)
            row += 1 + len(seq.spec_token_ids)
        if all(self._argmax_only(seq) for seq in seqs):
            self._verify_argmax(logits.argmax(dim=-1).tolist(), seqs, offsets)
            self.stats.verify_seconds += time.perf_counter() - since
            return
        plain = [i for i, seq in enumerate(seqs) if not seq.spec_token_ids]
        if plain:
            sub = logits[torch.tensor([offsets[i] for i in plain], device=logits.device)]
            self.post.constrain(sub, [seqs[i] for i in plain])
            self.post.sample(sub, [seqs[i] for i in plain])
        spec = [i for i, seq in enumerate(seqs) if seq.spec_token_ids]
        if spec:
            index = [offsets[i] + j for i in spec for j in range(1 + len(seqs[i].spec_token_ids))]
            self._verify(logits[torch.tensor(index, device=logits.device)], [seqs[i] for i in spec])
            self.stats.verify_seconds += time.perf_counter() - since

    def _argmax_only(self, seq: Sequence) -> bool:
        """Every row of seq takes the raw logits' argmax: greedy, no logprobs, penalties or grammar, and
        min_tokens reached (no row forbids a stop token)."""
        return plain_greedy(seq.params) and seq.grammar is None and not self.post.min_tokens_stop_ids(seq)

    def _verify_argmax(self, argmax: list[int], seqs: list[Sequence], offsets: list[int]) -> None:
        """verify() when every sequence is _argmax_only: one read-back of the rows' argmax, acceptance on the
        host (the longest prefix of proposals equal to the argmax at their rows, then the argmax after it:
        what accept() computes for greedy rows, without a dozen small kernels and their syncs)."""
        for seq, first in zip(seqs, offsets):
            proposed, a = seq.spec_token_ids, 0
            while a < len(proposed) and argmax[first + a] == proposed[a]:
                a += 1
            tokens = proposed[:a] + [argmax[first + a]]
            if not proposed:  # no proposals: sampled as post.sample would, the argmax
                self.post.append_token(seq, tokens[0], None)
                continue
            self.stats.record(len(proposed), a)
            appended = self._append(seq, tokens, [None] * len(tokens), False)
            self._roll_back(seq, appended)

    def _roll_back(self, seq: Sequence, appended: int) -> None:
        """After a verify step appended `appended` tokens to seq: K/V is valid for the last input and the
        tokens kept after it; the blocks past them go back to the pool."""
        seq.spec_token_ids = []
        if not seq.is_finished:
            seq.num_computed_tokens += appended - 1
            self.pool.truncate(seq, seq.num_computed_tokens)

    def _verify(self, logits: torch.Tensor, seqs: list[Sequence]) -> None:
        """logits: [R, V], the 1 + k rows of each of seqs (every one with k >= 1 proposals)."""
        drafts = Drafts([list(seq.spec_token_ids) for seq in seqs], [seq.params.greedy for seq in seqs],
                        [seq.generator for seq in seqs])
        rows = [row for seq, tokens in zip(seqs, drafts.tokens) for row in self.position_rows(seq, tokens)]
        logits = logits.to(torch.float32, copy=True)  # [R, V], processed in place below
        self.post.constrain_drafts(logits, seqs, drafts.tokens)  # grammars first, as before the sampler
        waiting = [seq.grammar is not None and not grammar_live(seq) for seq in seqs]  # reasoning, say
        raw = compute_raw_logprobs(logits, rows)  # before any processing, as the sampler does
        logits = apply_min_tokens(apply_penalties(logits, rows), rows)
        probs = None
        sampled = [i for i, r in enumerate(rows) if not r.params.greedy]
        if sampled:
            index = torch.tensor(sampled, device=logits.device)
            probs = torch.zeros_like(logits)
            probs[index] = sampling_probs(logits[index], [rows[i].params for i in sampled])
        num_accepted, emitted = accept(drafts, logits.argmax(dim=-1), probs)
        logprobs = self._logprobs(raw, rows, drafts, emitted, logits.device)
        for seq, proposed, tokens, a, first, wait in zip(seqs, drafts.tokens, emitted, num_accepted,
                                                         drafts.row_offsets(), waiting):
            self.stats.record(len(proposed), a)
            self._roll_back(seq, self._append(seq, tokens, logprobs[first:first + len(tokens)], wait))

    def position_rows(self, seq: Sequence, proposals: list[int]) -> list[SamplingRow]:
        """The sampler's view of seq at each of its 1 + k rows: row j follows proposals[:j], so its output
        (penalties) and min_tokens count them."""
        params, count = seq.params, seq.num_output_tokens
        stop_ids = self.post.min_tokens_stop_ids(seq)
        rows = []
        for j in range(len(proposals) + 1):
            output = seq.output_token_ids + proposals[:j] if _has_penalty(params) and j else seq.output_token_ids
            # _min_tokens_active reads len(output): the sequence's own list is short enough while it applies
            forbidden = stop_ids if count + j < params.min_tokens else ()
            rows.append(SamplingRow(params, seq.prompt_token_ids, output, seq.generator, forbidden))
        return rows

    def _logprobs(self, raw, rows: list[SamplingRow], drafts: Drafts, emitted: list[list[int]],
                  device: torch.device) -> list[dict | None]:
        """Per row, the logprobs entry of the token emitted there (None past the emitted ones, or unasked)."""
        if raw is None:
            return [None] * len(rows)
        tokens = torch.zeros(len(rows), dtype=torch.long)
        for first, out in zip(drafts.row_offsets(), emitted):
            tokens[first:first + len(out)] = torch.tensor(out)
        return gather_logprobs(raw, tokens.to(device), rows)

    def _append(self, seq: Sequence, tokens: list[int], logprobs: list[dict | None], grammar_waiting: bool) -> int:
        """Append tokens one by one with the usual stop checks; the ones after a stop are dropped, and so are
        those after the token that opens a grammar which was waiting (their rows were not masked). Returns
        how many were appended."""
        for count, (token, entry) in enumerate(zip(tokens, logprobs), start=1):
            self.post.append_token(seq, token, entry)
            if seq.is_finished or (grammar_waiting and grammar_live(seq)):
                return count
        return len(tokens)


def build_speculative_decoder(config, runtime, post: PostProcessor) -> SpeculativeDecoder | None:
    """The decoder of config.speculative_config (None without one); a draft model is loaded here."""
    spec = config.speculative_config
    if spec is None:
        return None
    if spec.method == "ngram":
        from graphllm.runtime.spec_decode.ngram import NgramProposer
        proposer = NgramProposer(spec.prompt_lookup_min, spec.prompt_lookup_max)
    elif spec.method == "oracle":  # graphllm bench spec: it hands the proposer its references
        from graphllm.runtime.spec_decode.oracle import OracleProposer
        proposer = OracleProposer(runtime.state.model_config.vocab_size, config.seed)
    else:
        from graphllm.runtime.spec_decode.draft_model import DraftModelProposer
        proposer = DraftModelProposer.load(spec, config, runtime.state, runtime.tokenizer)
    return SpeculativeDecoder(spec, proposer, runtime.pool, post, runtime.state.max_model_len)
