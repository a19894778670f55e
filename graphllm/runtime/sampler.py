"""Batched sampler: logits [B, V] plus per-row SamplingParams -> one token per row.

Order of operations (vLLM v1 defaults):
  raw logits -> logprobs (log_softmax, before anything else)
             -> logit_bias, penalties (repetition, presence, frequency)
             -> min_tokens (forbid stop ids)
             -> greedy rows: argmax
             -> other rows: temperature, top-k, top-p, min-p, softmax,
                exponential-race sampling (argmax(probs / q), q ~ Exp(1)).

A seeded row draws its q from its own generator, so its tokens do not depend
on the other rows of the batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Sequence

import torch

from graphllm.runtime.sampling_params import SamplingParams

FLOAT32_MAX = torch.finfo(torch.float32).max


@dataclass
class Logprob:
    """Log probability of one token under the raw model distribution."""

    logprob: float
    rank: int  # 1-based rank of this token in the raw distribution
    decoded_token: str | None = None  # filled later by the engine


class SamplingRow(NamedTuple):
    """Everything the sampler needs to know about one row of the logits."""

    params: SamplingParams
    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]
    generator: torch.Generator | None  # seeded, on the logits' device; None if unseeded
    min_tokens_stop_ids: Sequence[int]  # forbidden while len(output) < params.min_tokens


@dataclass
class SamplerOutput:
    """One sampled token per row, plus the requested logprobs per row."""

    token_ids: list[int]
    logprobs: list[dict[int, Logprob] | None]  # None where params.logprobs is None


class Sampler:
    """Turns a batch of logits into tokens following each row's SamplingParams."""

    def __call__(self, logits: torch.Tensor, rows: Sequence[SamplingRow]) -> SamplerOutput:
        """Sample one token per row of ``logits`` ([B, V], any float dtype)."""
        assert logits.dim() == 2 and logits.shape[0] == len(rows), (logits.shape, len(rows))
        if all(_plain_greedy(r) for r in rows):
            # Upcasting is exact, so the argmax of the raw logits is the argmax of float32 ones.
            return SamplerOutput(argmax_rows(logits).tolist(), [None] * len(rows))
        # logits: [B, V] float32; a private copy where penalties or min_tokens mutate it in place
        mutates = any(_has_penalty(r.params) or _min_tokens_active(r) for r in rows)
        logits = logits.to(torch.float32, copy=mutates)
        raw_logprobs = compute_raw_logprobs(logits, rows)
        logits = apply_penalties(logits, rows)
        logits = apply_min_tokens(logits, rows)
        token_ids = sample(logits, rows)  # [B]
        logprobs = gather_logprobs(raw_logprobs, token_ids, rows)
        return SamplerOutput(token_ids=token_ids.tolist(), logprobs=logprobs)


    def sample_on_device(self, logits: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor | None:
        """The rows' tokens as a [B] device tensor, nothing read back (async scheduling); None when a
        row needs host work after sampling (logprobs) or the token lists on the device (penalties)."""
        assert logits.dim() == 2 and logits.shape[0] == len(rows), (logits.shape, len(rows))
        if any(r.params.logprobs is not None or _has_penalty(r.params) for r in rows):
            return None
        if all(_plain_greedy(r) for r in rows):
            return argmax_rows(logits)
        logits = logits.to(torch.float32, copy=any(_min_tokens_active(r) for r in rows))
        return sample(apply_min_tokens(logits, rows), rows)


ARGMAX_CHUNKS = (256, 128, 64)  # column chunks of argmax_rows' first reduction, largest that divides V
ARGMAX_TWO_STAGE_ROWS = 16  # up to this many rows (kernel_sweep argmax, H200: faster at 1 and 8, slower at 256)


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """logits.argmax(dim=-1) of [B, V] logits, as two reductions on CUDA.

    PyTorch's argmax reduces each row in one pass: few rows leave most of the GPU idle. Chunks of
    columns first, then the chunk maxima, gives it B * V / chunk reductions to spread. Same index,
    ties included: both reductions return the first maximal index. Measured on the H200 over a
    128,256-word vocabulary (kernel_sweep argmax, us per call): 26.3 -> 10.0 at batch 1,
    26.6 -> 12.6 at batch 8, but 45.8 -> 85.7 at batch 256, hence ARGMAX_TWO_STAGE_ROWS."""
    rows, vocab = logits.shape
    chunk = next((c for c in ARGMAX_CHUNKS if vocab % c == 0 and vocab > c), None)
    if not logits.is_cuda or chunk is None or rows > ARGMAX_TWO_STAGE_ROWS:
        return logits.argmax(dim=-1)
    return two_stage_argmax(logits, chunk)


def two_stage_argmax(logits: torch.Tensor, chunk: int) -> torch.Tensor:
    """argmax(dim=-1) of [B, V] with V a multiple of chunk: the maxima and first indices of each chunk,
    then the first chunk holding the row maximum."""
    maxima, inner = logits.view(logits.shape[0], -1, chunk).max(dim=-1)  # [B, V / chunk] each
    best = maxima.argmax(dim=-1, keepdim=True)  # [B, 1]
    return (best * chunk + inner.gather(-1, best)).squeeze(-1)


# ---------------------------------------------------------------- logprobs


class _RawLogprobs(NamedTuple):
    row_idx: list[int]  # rows that asked for logprobs
    values: torch.Tensor  # [b, V] log_softmax of the raw logits of those rows


def compute_raw_logprobs(logits: torch.Tensor, rows: Sequence[SamplingRow]) -> _RawLogprobs | None:
    """log_softmax of the raw logits, only for rows that requested logprobs."""
    row_idx = [i for i, r in enumerate(rows) if r.params.logprobs is not None]
    if not row_idx:
        return None
    sub = logits[_index(row_idx, logits.device)]  # [b, V]
    return _RawLogprobs(row_idx, torch.log_softmax(sub, dim=-1))


def gather_logprobs(
    raw: _RawLogprobs | None, token_ids: torch.Tensor, rows: Sequence[SamplingRow]
) -> list[dict[int, Logprob] | None]:
    """Per row: {sampled token and top-N tokens: Logprob}, or None if not requested."""
    result: list[dict[int, Logprob] | None] = [None] * len(rows)
    if raw is None:
        return result
    vocab = raw.values.shape[1]
    sampled = token_ids[_index(raw.row_idx, token_ids.device)].unsqueeze(1)  # [b, 1]
    sampled_lp = raw.values.gather(1, sampled)  # [b, 1]
    # Competition rank: 1 + number of strictly more likely tokens.
    sampled_rank = (raw.values > sampled_lp).sum(dim=1) + 1  # [b]
    top_n = min(max(rows[i].params.logprobs for i in raw.row_idx), vocab)
    top_lp, top_ids = raw.values.topk(top_n, dim=1)  # [b, N] sorted descending
    tok, lp = sampled.squeeze(1).tolist(), sampled_lp.squeeze(1).tolist()
    rank = sampled_rank.tolist()
    top_lp_host, top_ids_host = top_lp.tolist(), top_ids.tolist()
    for j, i in enumerate(raw.row_idx):
        n = rows[i].params.logprobs
        # Sampled token first; top-N entries never overwrite it.
        entry = {tok[j]: Logprob(lp[j], rank[j])}
        for r, (alt_lp, alt_tok) in enumerate(zip(top_lp_host[j][:n], top_ids_host[j][:n]), 1):
            entry.setdefault(alt_tok, Logprob(alt_lp, r))
        result[i] = entry
    return result


# ---------------------------------------------------------------- penalties


def apply_logit_bias(logits: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
    """Each row's logit_bias added to its tokens' logits, in place (one scatter for the batch)."""
    row_of, id_of, bias = [], [], []
    for i, r in enumerate(rows):
        for token, value in (r.params.logit_bias or {}).items():
            row_of.append(i)
            id_of.append(token)
            bias.append(value)
    if row_of:
        values = torch.tensor(bias, dtype=logits.dtype, device=logits.device)
        logits.index_put_((_index(row_of, logits.device), _index(id_of, logits.device)), values, accumulate=True)
    return logits


def apply_penalties(logits: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
    """logit_bias, then repetition (prompt + output), presence and frequency (output) penalties, in place."""
    logits = apply_logit_bias(logits, rows)
    row_idx = [i for i, r in enumerate(rows) if _penalized(r.params)]
    if not row_idx:
        return logits
    device, vocab = logits.device, logits.shape[1]
    idx = _index(row_idx, device)
    params = [rows[i].params for i in row_idx]
    sub = logits[idx]  # [b, V]
    out_counts = token_counts([rows[i].output_token_ids for i in row_idx], vocab, device)
    if any(p.repetition_penalty != 1.0 for p in params):
        prompt_counts = token_counts([rows[i].prompt_token_ids for i in row_idx], vocab, device)
        penalty = _column([p.repetition_penalty for p in params], device)  # [b, 1]
        sub = apply_repetition_penalty(sub, (prompt_counts + out_counts) > 0, penalty)
    presence = _column([p.presence_penalty for p in params], device)  # [b, 1]
    frequency = _column([p.frequency_penalty for p in params], device)  # [b, 1]
    sub = sub - frequency * out_counts - presence * (out_counts > 0).float()
    logits[idx] = sub
    return logits


def apply_repetition_penalty(
    logits: torch.Tensor, seen: torch.Tensor, penalty: torch.Tensor
) -> torch.Tensor:
    """HF semantics: seen tokens get logit / p if positive, logit * p otherwise.

    logits: [b, V]; seen: [b, V] bool; penalty: [b, 1].
    """
    penalized = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalized, logits)


def token_counts(seqs: Sequence[Sequence[int]], vocab: int, device: torch.device) -> torch.Tensor:
    """Occurrence count of every vocab id in each sequence: [len(seqs), vocab] float32."""
    max_len = max((len(s) for s in seqs), default=0)
    counts = torch.zeros(len(seqs), vocab + 1, dtype=torch.float32, device=device)
    if max_len == 0:
        return counts[:, :vocab]
    # Pad with `vocab`, a dump column sliced off afterwards.
    padded = [list(s) + [vocab] * (max_len - len(s)) for s in seqs]
    ids = torch.tensor(padded, dtype=torch.long, device=device)  # [b, L]
    counts.scatter_add_(1, ids, torch.ones_like(ids, dtype=torch.float32))
    return counts[:, :vocab]


def apply_min_tokens(logits: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
    """-inf on min_tokens_stop_ids for rows still shorter than min_tokens, in place; a row whose only
    allowed tokens are those (a grammar that can only end here) keeps them: the grammar ends the output."""
    vocab = logits.shape[1]
    row_of, id_of = [], []
    for i, r in enumerate(rows):
        if not _min_tokens_active(r):
            continue
        ids = [t for t in r.min_tokens_stop_ids if 0 <= t < vocab]
        row_of.extend([i] * len(ids))
        id_of.extend(ids)
    if row_of:
        row, col = _index(row_of, logits.device), _index(id_of, logits.device)
        kept = logits[row, col]  # [n]
        logits[row, col] = float("-inf")
        emptied = (logits == float("-inf")).all(dim=-1)  # [B]; torch.where: no sync on the device path
        logits[row, col] = torch.where(emptied[row], kept, logits[row, col])
    return logits


# ---------------------------------------------------------------- sampling


def sample(logits: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
    """Greedy rows take the argmax; the others are sampled. Returns token ids [B]."""
    token_ids = logits.argmax(dim=-1)  # [B]
    row_idx = [i for i, r in enumerate(rows) if not r.params.greedy]
    if not row_idx:
        return token_ids
    idx = _index(row_idx, logits.device)
    probs = sampling_probs(logits[idx], [rows[i].params for i in row_idx])  # [b, V]
    token_ids[idx] = exponential_race(probs, [rows[i].generator for i in row_idx])
    return token_ids


def sampling_probs(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """The distribution a non-greedy row samples from: temperature, top-k, top-p, min-p, softmax.

    logits: [b, V] float32, penalties and min_tokens already applied (speculative decoding's verifier
    calls it per position too); returns [b, V]."""
    device = logits.device
    # +inf (a repetition penalty near 0, a small temperature) would make the softmax NaN: the largest float
    # instead, so that the row samples among its largest logits
    sub = (logits / _column([p.temperature for p in params], device)).clamp_(max=FLOAT32_MAX)  # [b, V]
    sub = apply_top_k_top_p(sub, _top_k(params, sub.shape[1], device), _top_p(params, device))
    sub = apply_min_p(sub, _min_p(params, device))
    return torch.softmax(sub, dim=-1)  # [b, V]


def exponential_race(
    probs: torch.Tensor, generators: Sequence[torch.Generator | None]
) -> torch.Tensor:
    """argmax(probs / q) with q ~ Exp(1) i.i.d. is a draw from probs ([b, V] -> [b])."""
    q = torch.empty_like(probs).exponential_()  # [b, V]
    for i, gen in enumerate(generators):
        if gen is not None:
            q[i].exponential_(generator=gen)
    # q == 0 would turn a masked token's 0/0 into NaN, which argmax picks.
    q.clamp_min_(torch.finfo(q.dtype).tiny)
    return (probs / q).argmax(dim=-1)


def apply_top_k_top_p(
    logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None
) -> torch.Tensor:
    """Mask (-inf) tokens outside each row's top-k, then outside its top-p nucleus.

    logits: [b, V]; top_k: [b, 1] long (V where off) or None; top_p: [b, 1] or None.
    """
    if top_k is None and top_p is None:
        return logits
    # Stable descending sort: among ties the lowest id comes first, as in argmax,
    # so top_k == 1 reproduces greedy exactly.
    sorted_logits, sorted_ids = logits.sort(dim=-1, descending=True, stable=True)  # [b, V]
    if top_k is not None:
        position = torch.arange(logits.shape[1], device=logits.device)  # [V]
        sorted_logits.masked_fill_(position >= top_k, float("-inf"))
    if top_p is not None:
        probs = torch.softmax(sorted_logits, dim=-1)  # [b, V]
        mass_before = probs.cumsum(dim=-1) - probs  # [b, V]
        # The first token always survives (mass_before == 0 < top_p).
        outside = (mass_before >= top_p) & (top_p < 1.0)
        sorted_logits.masked_fill_(outside, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, sorted_ids, sorted_logits)


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor | None) -> torch.Tensor:
    """Mask tokens whose probability is below min_p * (max probability of the row).

    logits: [b, V]; min_p: [b, 1] or None.
    """
    if min_p is None:
        return logits
    probs = torch.softmax(logits, dim=-1)  # [b, V]
    threshold = min_p * probs.amax(dim=-1, keepdim=True)  # [b, 1]
    return logits.masked_fill(probs < threshold, float("-inf"))


# ---------------------------------------------------------------- helpers


def _has_penalty(p: SamplingParams) -> bool:
    """Whether the row's logits change before sampling beyond min_tokens: penalties or a logit_bias."""
    return _penalized(p) or bool(p.logit_bias)


def _penalized(p: SamplingParams) -> bool:
    return p.repetition_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0


def _min_tokens_active(r: SamplingRow) -> bool:
    return bool(r.min_tokens_stop_ids) and len(r.output_token_ids) < r.params.min_tokens


def _plain_greedy(r: SamplingRow) -> bool:
    """A row whose token is the argmax of its raw logits, with nothing else to compute."""
    return plain_greedy(r.params) and not _min_tokens_active(r)


def plain_greedy(p: SamplingParams) -> bool:
    """Params whose token is the raw logits' argmax whenever min_tokens forbids nothing."""
    return p.greedy and p.logprobs is None and not _has_penalty(p)


def _top_k(params: list[SamplingParams], vocab: int, device: torch.device) -> torch.Tensor | None:
    if not any(p.top_k_enabled for p in params):
        return None
    ks = [min(p.top_k, vocab) if p.top_k_enabled else vocab for p in params]
    return torch.tensor(ks, dtype=torch.long, device=device).unsqueeze(1)  # [b, 1]


def _top_p(params: list[SamplingParams], device: torch.device) -> torch.Tensor | None:
    if all(p.top_p >= 1.0 for p in params):
        return None
    return _column([p.top_p for p in params], device)


def _min_p(params: list[SamplingParams], device: torch.device) -> torch.Tensor | None:
    if all(p.min_p <= 0.0 for p in params):
        return None
    return _column([p.min_p for p in params], device)


def _column(values: list[float], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32, device=device).unsqueeze(1)  # [b, 1]


def _index(values: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long, device=device)
