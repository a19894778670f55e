"""Scheduled sequences -> the flat tensors of one model step (DESIGN.md's step contract).

`prepare_step` builds the step on the host with numpy (no per-token Python loops, no copies of
whole token lists): a HostStep. `HostStep.to_device` moves it in ONE host-to-device copy (every
field is a slice of one packed int64 buffer); the CUDA-graph runner instead writes it into its
own pinned staging buffer. Attention backends that plan on the CPU (FlashInfer) read
`HostStep.attention`.
"""

from typing import NamedTuple

import numpy as np
import torch

from graphllm.ops.attention import AttentionMetadata
from graphllm.backends import HostMeta
from graphllm.runtime.scheduler import ScheduledSeq
from graphllm.runtime.sequence import PENDING

ALIGN = 16  # elements: each packed field starts 128-byte aligned, as compiled kernels assume


class StepInputs(NamedTuple):
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    meta: AttentionMetadata
    logits_indices: torch.Tensor  # [N] rows of the flat batch whose logits are sampled

    def flat(self) -> tuple:
        """The step's arguments in graphllm.ir.STEP_INPUT_NAMES order."""
        m = self.meta
        return (self.input_ids, self.positions, m.slot_mapping, m.block_tables, m.seq_lens,
                m.query_start_loc, self.logits_indices, m.kv_caches)


class HostStep(NamedTuple):
    """One step's inputs as int64 numpy arrays, in STEP_INPUT_NAMES order (without the caches)."""

    input_ids: np.ndarray  # [T]
    positions: np.ndarray  # [T]
    slot_mapping: np.ndarray  # [T]
    block_tables: np.ndarray  # [B, M] padded with 0
    seq_lens: np.ndarray  # [B]
    query_start_loc: np.ndarray  # [B+1]
    logits_indices: np.ndarray  # [N]

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens)

    @property
    def attention(self) -> HostMeta:
        return HostMeta(self.query_start_loc, self.seq_lens, self.block_tables)

    def to_device(self, kv_caches: list[torch.Tensor], device: torch.device) -> StepInputs:
        packed = torch.from_numpy(pack(self))
        if device.type == "cuda":  # pinned: the copy does not wait for a step still in flight
            packed = packed.pin_memory()
        packed = packed.to(device, non_blocking=True)
        fields = unpack(packed, [a.shape for a in self])
        ids, pos, slots, tables, seq_lens, starts, logits_indices = fields
        return StepInputs(ids, pos, AttentionMetadata(slots, tables, seq_lens, starts, kv_caches), logits_indices)


def packed_offsets(shapes: list[tuple[int, ...]]) -> list[int]:
    """Start of each field in the packed buffer (ALIGN-ed), plus the total length last."""
    offsets = [0]
    for shape in shapes:
        offsets.append(offsets[-1] + -(-int(np.prod(shape)) // ALIGN) * ALIGN)
    return offsets


def pack(arrays, out: np.ndarray | None = None) -> np.ndarray:
    """Concatenate the arrays at their ALIGN-ed offsets (into `out` when given)."""
    offsets = packed_offsets([a.shape for a in arrays])
    out = np.zeros(offsets[-1], np.int64) if out is None else out
    for a, start in zip(arrays, offsets):
        out[start:start + a.size] = a.ravel()
    return out


def unpack(packed: torch.Tensor, shapes: list[tuple[int, ...]]) -> list[torch.Tensor]:
    """Views of `packed` with the given shapes, at the offsets `pack` used."""
    offsets = packed_offsets(shapes)
    return [packed[start:start + int(np.prod(shape))].view(shape) for shape, start in zip(shapes, offsets)]


def prepare_step(batch: list[ScheduledSeq], block_size: int) -> HostStep:
    """The flat inputs of one step. A sequence that samples and carries proposed tokens
    (seq.spec_token_ids, speculative decoding) runs them after its new tokens, and each of them adds a
    logits row: its k + 1 rows are the target's distributions after its last token and each proposal."""
    b = len(batch)
    starts = np.fromiter((s.seq.num_computed_tokens for s in batch), np.int64, b)  # [B]
    num_new = np.fromiter((s.num_new_tokens for s in batch), np.int64, b)  # [B]
    samples = starts + num_new == np.fromiter((s.seq.num_tokens for s in batch), np.int64, b)  # [B]
    num_spec = np.fromiter((len(s.seq.spec_token_ids) for s in batch), np.int64, b) * samples  # [B]
    num_query = num_new + num_spec  # [B]
    seq_lens = starts + num_query
    query_start_loc = np.zeros(b + 1, np.int64)
    np.cumsum(num_query, out=query_start_loc[1:])
    tables = block_table_array([s.seq.block_table for s in batch])  # [B, M]
    if query_start_loc[-1] == b:  # decode: one token each
        input_ids = np.fromiter((s.seq.token_ids[start] for s, start in zip(batch, starts.tolist())), np.int64, b)
        positions, seq_of_token = starts, np.arange(b)
    else:
        input_ids = np.array([t for s, start, n, k in zip(batch, starts.tolist(), num_new.tolist(), num_spec.tolist())
                              for t in s.seq.token_ids[start:start + n] + s.seq.spec_token_ids[:k]], np.int64)
        seq_of_token = np.repeat(np.arange(b), num_query)  # [T]
        positions = np.arange(query_start_loc[-1]) - query_start_loc[seq_of_token] + starts[seq_of_token]
    slots = tables[seq_of_token, positions // block_size] * block_size + positions % block_size  # [T]
    return HostStep(input_ids, positions, slots, tables, seq_lens, query_start_loc,
                    logits_rows(query_start_loc, samples, num_spec))


def logits_rows(query_start_loc: np.ndarray, samples: np.ndarray, num_spec: np.ndarray) -> np.ndarray:
    """[N] the flat rows whose logits the step returns: each sampling sequence's last 1 + k rows."""
    ends = query_start_loc[1:][samples]  # [S]
    if not num_spec.any():
        return ends - 1
    counts = num_spec[samples] + 1  # [S]
    first = np.repeat(ends - counts, counts)  # [N]
    return first + np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)


def pending_inputs(batch: list[ScheduledSeq], host: HostStep) -> tuple[np.ndarray, np.ndarray] | None:
    """Input tokens still on the device (async scheduling): (their flat positions in the step,
    their rows in the in-flight step's sampled tokens), or None. A pending token is always its
    sequence's last, so it is the last new token of that sequence in this step. Its placeholder
    in host.input_ids becomes 0, a valid id, until the device writes the token over it."""
    rows = [(i, s.seq.pending_row) for i, s in enumerate(batch) if s.seq.pending_row is not None]
    if not rows:
        return None
    seqs, src = np.array(rows, np.int64).T
    dst = host.query_start_loc[seqs + 1] - 1
    assert (host.input_ids[dst] == PENDING).all(), "a pending token must be the last new token of its sequence"
    host.input_ids[dst] = 0
    return dst, src


def fill_pending(input_ids: torch.Tensor, pending: tuple[np.ndarray, np.ndarray], tokens: torch.Tensor) -> None:
    """input_ids[dst] = tokens[src] on the device, queued behind the step that samples `tokens`."""
    index = torch.from_numpy(np.stack(pending))
    if input_ids.is_cuda:  # pinned: the copy neither waits for the step in flight nor blocks the host
        index = index.pin_memory()
    index = index.to(input_ids.device, non_blocking=True)
    input_ids[index[0]] = tokens[index[1]]


def advance(host: HostStep, steps: int, block_size: int) -> HostStep:
    """The decode step `steps` tokens after `host` (a decode step): positions, slots and lengths move
    on; input_ids are left as they are (the device writes the previous step's tokens over them).
    The block tables must already cover the later positions."""
    positions = host.positions + steps
    rows = np.arange(len(positions))
    slots = host.block_tables[rows, positions // block_size] * block_size + positions % block_size
    return host._replace(positions=positions, slot_mapping=slots, seq_lens=host.seq_lens + steps)


def uniform_fits(host: HostStep, q: int, bucket: int, max_blocks: int, block_size: int) -> bool:
    """Whether host can run as `bucket` sequences of exactly q query tokens (pad_uniform): at most bucket
    sequences of 1..q tokens each, every token a logits row (decode rows and verify rows of speculative
    decoding), and each padded span within max_blocks pages."""
    counts = np.diff(host.query_start_loc)  # [B]
    if host.num_seqs > bucket or len(host.logits_indices) != len(host.input_ids) or host.block_tables.shape[1] > max_blocks:
        return False
    first = host.seq_lens - counts  # [B] positions of the sequences' first new tokens
    return bool((counts >= 1).all() and (counts <= q).all() and (first + q <= max_blocks * block_size).all())


def pad_uniform(host: HostStep, q: int, bucket: int, padding_block: int, block_size: int,
                max_blocks: int) -> tuple[HostStep, np.ndarray]:
    """host (uniform_fits) as `bucket` sequences of exactly q tokens each, the shape a captured verify graph
    replays; returns it and the rows of its logits that are host's own logits rows, in host's order.

    Sequence i's tokens move to rows i*q..; its padding tokens continue its positions (so causal attention
    places its real tokens where they were: seq_lens grows by the padding) and write their K/V to the
    padding block's first slot; rows past host's sequences are one-page sequences of q tokens in the
    padding block. No real token attends to a padding token (they come after it), so the real rows'
    logits and K/V are those of the unpadded step; the padding rows' are garbage, never read."""
    b, counts = host.num_seqs, np.diff(host.query_start_loc)  # [B]
    first = host.seq_lens - counts  # [B]
    offsets = np.arange(q)  # [q]
    positions = np.tile(offsets, bucket)  # [bucket * q]: padding sequences' positions
    positions[:b * q] = (first[:, None] + offsets[None, :]).ravel()
    real = (offsets[None, :] < counts[:, None]).ravel()  # [b * q]
    rows = np.flatnonzero(real)  # host's tokens (= its logits rows) in order
    input_ids = np.zeros(bucket * q, np.int64)
    input_ids[rows] = host.input_ids
    slots = np.full(bucket * q, padding_block * block_size, np.int64)
    slots[rows] = host.slot_mapping
    tables = np.zeros((bucket, max_blocks), np.int64)
    tables[:b, :host.block_tables.shape[1]] = host.block_tables
    tables[b:, 0] = padding_block
    seq_lens = np.full(bucket, q, np.int64)
    seq_lens[:b] = first + q
    padded = HostStep(input_ids, positions, slots, tables, seq_lens, np.arange(bucket + 1) * q,
                      np.arange(bucket * q))
    return padded, rows


def block_table_array(tables: list[list[int]]) -> np.ndarray:
    """Block tables padded with 0 to the longest: [B, M] int64."""
    out = np.zeros((len(tables), max(len(t) for t in tables)), np.int64)
    for row, table in zip(out, tables):
        row[:len(table)] = table
    return out


def pad_mixed(host: HostStep, tokens: int, seqs: int, padding_block: int, block_size: int,
              max_blocks: int) -> HostStep | None:
    """host, a step that carries prompt tokens (more tokens than sequences), grown to the shape a captured mixed
    graph replays: `tokens` tokens, `seqs` sequences and `seqs` logits rows; None if it does not fit.

    host's tokens, sequences and logits rows stay where they are, first. The padding tokens form padding
    sequences of their own after host's, each at most max_blocks pages long (positions 0..n-1, every page the
    padding block, K/V written into the padding block's slots), and the remaining padding sequences have no
    tokens at all (query length and seq_len 0: every attention kernel skips them). No real token attends to a
    padding token (they are other sequences), so the real rows' logits and K/V are those of the unpadded step.
    The padding logits rows repeat the last token's row."""
    t, b, n = len(host.input_ids), host.num_seqs, len(host.logits_indices)
    extra, spare, cap = tokens - t, seqs - b, max_blocks * block_size
    if (tokens <= seqs or extra < 0 or spare < 0 or n > seqs or host.block_tables.shape[1] > max_blocks
            or extra > spare * cap):
        return None
    counts = np.zeros(spare, np.int64)  # [spare] tokens of each padding sequence
    full, rest = divmod(extra, cap)
    counts[:full] = cap
    if rest:
        counts[full] = rest
    local = np.arange(extra) - np.repeat(np.cumsum(counts) - counts, counts)  # [extra] position in its sequence
    tables = np.full((seqs, max_blocks), padding_block, np.int64)
    tables[:b] = 0
    tables[:b, :host.block_tables.shape[1]] = host.block_tables
    query_start_loc = np.concatenate([host.query_start_loc, t + np.cumsum(counts)])
    logits = np.full(seqs, tokens - 1, np.int64)
    logits[:n] = host.logits_indices
    return HostStep(np.concatenate([host.input_ids, np.zeros(extra, np.int64)]),
                    np.concatenate([host.positions, local]),
                    np.concatenate([host.slot_mapping, padding_block * block_size + local % block_size]),
                    tables, np.concatenate([host.seq_lens, counts]), query_start_loc, logits)
