"""Capture: the model's step -> a torch.fx graph that owns its weights (a StepGraph).

Route: torch.export in non-strict mode, with symbolic sizes for tokens (T), sequences (B),
blocks per sequence (M) and sampled rows (N). Why this route and not a Dynamo backend:
- The whole step is one graph or an error at compile time; nothing is traced while serving.
- The graph arrives ahead of time together with its weights (get_attr nodes on the
  GraphModule), so passes can rewrite both and the artifact can store the post-pass weights.
  Under a Dynamo backend the weights are runtime inputs owned by the frame, and graphs
  arrive lazily on first call, keyed by guards.
- The "training IR" keeps aten.linear, silu, mul ... so passes match small, readable patterns,
  and every node carries nn_module_stack (the module path) and stack_trace (the source line).
- The same ExportedProgram feeds AOTInductor, whose .pt2 package loads in a fresh process
  with no Dynamo re-tracing and no code generation, from any directory.
- Symbolic sizes with explicit ranges give one graph for every batch shape: no 0/1
  specialisation recompiles, and the same callable serves prefill, decode and mixed steps.
"""

import torch
from torch import nn
from torch.export import Dim

from graphllm.ir.graph import StepGraph
from graphllm.models.config import ModelConfig
from graphllm.ops.attention import AttentionMetadata

STEP_INPUT_NAMES = ("input_ids", "positions", "slot_mapping", "block_tables", "seq_lens",
                    "query_start_loc", "logits_indices", "kv_caches")


class StepModule(nn.Module):
    """One engine step over flat tensors: tokens in, logits of the sampled rows out."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, positions, slot_mapping, block_tables, seq_lens, query_start_loc,
                logits_indices, kv_caches):
        meta = AttentionMetadata(slot_mapping, block_tables, seq_lens, query_start_loc, kv_caches)
        hidden = self.model(input_ids, positions, meta)  # [T, hidden]
        return self.model.compute_logits(hidden[logits_indices])  # [N, vocab]


def example_step_inputs(config: ModelConfig, dtype: torch.dtype, device: torch.device,
                        block_size: int = 16, num_blocks: int = 16) -> tuple:
    """A mixed step of three sequences: a 4-token prefill, a decode at position 16, and a 4-token
    prefill chunk that does not sample yet.

    Every dynamic size differs from the others and from 1 (T=9, B=3, B+1=4, M=5, N=2, 16 KV
    blocks): equal sizes would be unified into one symbol and size 1 specialised.
    """
    i64 = dict(dtype=torch.int64, device=device)
    input_ids = torch.tensor([3, 4, 5, 6, 7, 8, 9, 10, 11], **i64)
    positions = torch.tensor([0, 1, 2, 3, 16, 0, 1, 2, 3], **i64)
    slot_mapping = torch.tensor([0, 1, 2, 3, 2 * block_size, 3 * block_size, 3 * block_size + 1,
                                 3 * block_size + 2, 3 * block_size + 3], **i64)
    block_tables = torch.tensor([[0, 0, 0, 0, 0], [1, 2, 0, 0, 0], [3, 0, 0, 0, 0]], **i64)
    seq_lens = torch.tensor([4, 17, 4], **i64)
    query_start_loc = torch.tensor([0, 4, 5, 9], **i64)
    logits_indices = torch.tensor([3, 4], **i64)
    shape = config.kv_cache_shape(num_blocks, block_size)
    kv_caches = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)]
    return (input_ids, positions, slot_mapping, block_tables, seq_lens, query_start_loc, logits_indices,
            kv_caches)


def max_num_logits(max_num_tokens: int) -> int:
    """The most logits rows a step captured for max_num_tokens returns: one per token at most (speculative
    decoding's verify steps sample every token of a sequence's k + 1), not one per sequence."""
    return max(max_num_tokens, 9)


# sequences a step may take beyond the scheduler's max_num_seqs: a mixed-step CUDA graph pads a full batch with a
# padding sequence of its own (graphllm/runtime/mixed_graphs.py)
GRAPH_PADDING_SEQS = 1


def step_dynamic_shapes(config: ModelConfig, max_num_tokens: int, max_num_seqs: int,
                        max_blocks_per_seq: int) -> tuple:
    # ranges at least cover the example step (T=9, B=3, M=5), whatever smaller limits ask
    tokens = Dim("T", min=1, max=max(max_num_tokens, 9))
    seqs = Dim("B", min=1, max=max(max_num_seqs + GRAPH_PADDING_SEQS, 3))
    blocks = Dim("M", min=1, max=max(max_blocks_per_seq, 5))
    sampled = Dim("N", min=1, max=max_num_logits(max_num_tokens))
    cache_blocks = Dim("num_kv_blocks", min=2)  # sized at load time from free memory
    return ({0: tokens}, {0: tokens}, {0: tokens}, {0: seqs, 1: blocks}, {0: seqs}, {0: seqs + 1},
            {0: sampled}, [{1: cache_blocks}] * config.num_hidden_layers)


def capture(model: nn.Module, config: ModelConfig, dtype: torch.dtype, device: torch.device,
            max_num_tokens: int = 8192, max_num_seqs: int = 256, max_blocks_per_seq: int = 4096,
            block_size: int = 16) -> StepGraph:
    """Export the model's step as a StepGraph (weights become the GraphModule's attributes).

    block_size: the KV cache's tokens per block, a static size of the graph's cache inputs (Inductor's step
    asserts it on every call)."""
    inputs = example_step_inputs(config, dtype, device, block_size)
    dynamic = step_dynamic_shapes(config, max_num_tokens, max_num_seqs, max_blocks_per_seq)
    exported = torch.export.export(StepModule(model), inputs, dynamic_shapes=dynamic, strict=False)
    return StepGraph(exported.module(), inputs, dynamic)
