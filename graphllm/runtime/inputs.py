"""Scheduled sequences -> the flat tensors of one model step (DESIGN.md's step contract)."""

from typing import NamedTuple

import torch

from graphllm.ops.attention import AttentionMetadata
from graphllm.runtime.scheduler import ScheduledSeq


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


def prepare_step(batch: list[ScheduledSeq], kv_caches: list[torch.Tensor], block_size: int,
                 device: torch.device) -> StepInputs:
    input_ids, positions, slots, seq_lens, starts, logits_indices = [], [], [], [], [0], []
    for seq, num_new in batch:
        start = seq.num_computed_tokens
        input_ids += seq.token_ids[start:start + num_new]
        span = range(start, start + num_new)
        positions += span
        slots += [seq.block_table[p // block_size] * block_size + p % block_size for p in span]
        seq_lens.append(start + num_new)
        starts.append(starts[-1] + num_new)
        if ScheduledSeq(seq, num_new).samples:
            logits_indices.append(starts[-1] - 1)
    max_blocks = max(len(s.seq.block_table) for s in batch)
    tables = [s.seq.block_table + [0] * (max_blocks - len(s.seq.block_table)) for s in batch]

    def tensor(values) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64).to(device, non_blocking=True)

    meta = AttentionMetadata(slot_mapping=tensor(slots), block_tables=tensor(tables),
                             seq_lens=tensor(seq_lens), query_start_loc=tensor(starts),
                             kv_caches=kv_caches)
    return StepInputs(tensor(input_ids), tensor(positions), meta, tensor(logits_indices))
