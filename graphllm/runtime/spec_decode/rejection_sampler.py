"""Which proposed tokens the target accepts, and the token it adds after them.

A sequence with k proposals d_1..d_k has k + 1 target rows: row j is the target's (processed) distribution
p_j after the sequence's tokens and d_1..d_j. It emits a + 1 tokens: the a accepted proposals, then one
more drawn from the target.

- Greedy rows: a is the longest prefix of proposals equal to the target's argmax at their rows, and the
  token after them is the argmax at row a (the correction on a mismatch, the bonus token when all k pass).
- Sampled rows (Leviathan et al. 2023; vLLM's rejection sampler): proposal d_j is accepted with probability
  min(1, p_j(d_j) / q_j(d_j)); at the first rejection the token is drawn from normalize(max(0, p_j - q_j)),
  and when all k pass the bonus token is drawn from p_k. Every token then follows the target's distribution
  exactly. Both proposers here are deterministic, so q_j is a point mass on d_j: accept with probability
  p_j(d_j), and on rejection draw from p_j with d_j removed. A draft distribution q can be given instead.

A seeded sequence draws its k uniforms and its final exponential race from its own generator, so its
tokens depend on its seed and its proposals only.
"""

from typing import NamedTuple

import torch

from graphllm.runtime.sampler import exponential_race


class Drafts(NamedTuple):
    """The rows of one verify step's sequences, [R] = sum over sequences of (k_s + 1)."""

    tokens: list[list[int]]  # per sequence, its k_s proposals
    greedy: list[bool]  # per sequence
    generators: list[torch.Generator | None]  # per sequence; None draws from the global generator

    def row_offsets(self) -> list[int]:
        """The first row of each sequence (rows are laid out sequence after sequence)."""
        offsets, row = [], 0
        for tokens in self.tokens:
            offsets.append(row)
            row += len(tokens) + 1
        return offsets


def accept(drafts: Drafts, argmax: torch.Tensor, probs: torch.Tensor | None,
           draft_probs: torch.Tensor | None = None) -> tuple[list[int], list[list[int]]]:
    """(accepted proposals per sequence, the tokens each emits: its accepted proposals and one more).

    argmax: [R] the target's argmax per row (read for greedy sequences); probs: [R, V] the target's
    sampling distribution per row (read for sampled ones; None when every sequence is greedy);
    draft_probs: [R, V] the proposer's distribution at each proposal's row (None: a point mass)."""
    device, s = argmax.device, len(drafts.tokens)
    width = max(len(t) for t in drafts.tokens)  # K
    offsets = torch.tensor(drafts.row_offsets(), device=device)  # [S]
    lengths = torch.tensor([len(t) for t in drafts.tokens], device=device)  # [S]
    columns = torch.arange(width + 1, device=device)  # [K + 1]
    rows = offsets[:, None] + torch.minimum(columns, lengths[:, None])  # [S, K + 1], padding repeats row k
    proposed = torch.tensor([t + [0] * (width - len(t)) for t in drafts.tokens], dtype=torch.long,
                            device=device).view(s, width)  # [S, K]
    greedy = torch.tensor(drafts.greedy, device=device)  # [S]
    ok = argmax[rows[:, :width]] == proposed  # [S, K] greedy acceptance
    if probs is not None:
        ok = torch.where(greedy[:, None], ok, sampled_acceptance(drafts, probs, rows, proposed, draft_probs))
    ok &= columns[:width] < lengths[:, None]
    num_accepted = ok.int().cumprod(dim=1).sum(dim=1)  # [S]
    final_rows = rows.gather(1, num_accepted[:, None]).squeeze(1)  # [S]
    final = argmax[final_rows]  # [S]
    if probs is not None and not all(drafts.greedy):
        final = torch.where(greedy, final, draw_final(drafts, probs, final_rows, num_accepted, lengths, proposed,
                                                       draft_probs))
    num_host, final_host, proposed_host = num_accepted.tolist(), final.tolist(), drafts.tokens
    return num_host, [proposed_host[i][:a] + [final_host[i]] for i, a in enumerate(num_host)]


def sampled_acceptance(drafts: Drafts, probs: torch.Tensor, rows: torch.Tensor, proposed: torch.Tensor,
                       draft_probs: torch.Tensor | None) -> torch.Tensor:
    """[S, K]: u < p(d) / q(d) with u ~ U(0, 1), one uniform per proposal."""
    width = proposed.shape[1]
    p = probs[rows[:, :width], proposed]  # [S, K]
    q = torch.ones_like(p) if draft_probs is None else draft_probs[rows[:, :width], proposed]
    u = uniforms(drafts, width, probs.device)  # [S, K]
    return u * q < p


def uniforms(drafts: Drafts, width: int, device: torch.device) -> torch.Tensor:
    """[S, K] uniforms: k_s of them from each sequence's own generator (a seeded one draws the same whatever
    the batch), padded with ones."""
    u = torch.ones(len(drafts.tokens), width, device=device)
    for i, (tokens, gen) in enumerate(zip(drafts.tokens, drafts.generators)):
        if tokens and not drafts.greedy[i]:
            u[i, :len(tokens)] = torch.rand(len(tokens), generator=gen, device=device)
    return u


def draw_final(drafts: Drafts, probs: torch.Tensor, final_rows: torch.Tensor, num_accepted: torch.Tensor,
               lengths: torch.Tensor, proposed: torch.Tensor, draft_probs: torch.Tensor | None) -> torch.Tensor:
    """[S] the token after the accepted ones: from max(0, p - q) at a rejected row, from p after all k."""
    p = probs[final_rows]  # [S, V]
    if proposed.shape[1]:
        rejected = num_accepted < lengths  # [S]
        if draft_probs is None:  # a point mass: p without the rejected proposal
            at = proposed.gather(1, num_accepted.clamp(max=proposed.shape[1] - 1)[:, None])  # [S, 1]
            residual = p.scatter(1, at, 0.0)
        else:
            residual = (p - draft_probs[final_rows]).clamp_min(0.0)
        empty = residual.sum(dim=1, keepdim=True) <= 0  # only by rounding (p(d) ~ 1 yet rejected): p itself
        p = torch.where(rejected[:, None] & ~empty, residual, p)  # unnormalised: the race does not mind
    sampled = [i for i, greedy in enumerate(drafts.greedy) if not greedy]
    tokens = torch.zeros(len(drafts.tokens), dtype=torch.long, device=p.device)
    index = torch.tensor(sampled, dtype=torch.long, device=p.device)
    tokens[index] = exponential_race(p[index], [drafts.generators[i] for i in sampled])
    return tokens
