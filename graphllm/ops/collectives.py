"""The tensor-parallel collectives as registered custom ops: what shard_tp puts after row-parallel linears,
the vocabulary-parallel embedding and lm_head.

    graphllm.all_reduce(x, group_name)               -> the sum of x over the group's ranks (a new tensor)
    graphllm.all_gather(x, world_size, group_name)   -> the ranks' x concatenated along dim 0, rank order

Each is one synchronous torch.distributed call (gloo on CPU, NCCL on GPUs, which CUDA graphs capture) on
the process group registered under group_name. They are ops of graphllm's own, not torch's functional
collectives (_c10d_functional.all_reduce + wait_tensor), so that one place picks the implementation:
the AOTInductor CPU code calling the functional collectives through its C shim hung one run in three on
the second step (both ranks waiting in the first all-reduce; gloo, torch 2.13, 2026-11-25), where these
Python ops did not; and a faster all-reduce (symmetric-memory one-shot / two-shot, see
benchmarks/allreduce_bench.py) can take over here without touching the pass.
"""

import torch
import torch.distributed as dist


def _group(group_name: str):
    from torch.distributed.distributed_c10d import _resolve_process_group
    return _resolve_process_group(group_name)


@torch.library.custom_op("graphllm::all_reduce", mutates_args=())
def all_reduce(x: torch.Tensor, group_name: str) -> torch.Tensor:
    """x summed over the ranks of group_name; a new contiguous tensor."""
    out = x.contiguous().clone()
    dist.all_reduce(out, group=_group(group_name))
    return out


@all_reduce.register_fake
def _(x, group_name):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op("graphllm::all_gather", mutates_args=())
def all_gather(x: torch.Tensor, world_size: int, group_name: str) -> torch.Tensor:
    """[world_size * x.shape[0], ...]: rank r's x at rows r * x.shape[0] onwards."""
    out = x.new_empty((world_size * x.shape[0], *x.shape[1:]))
    dist.all_gather_into_tensor(out, x.contiguous(), group=_group(group_name))
    return out


@all_gather.register_fake
def _(x, world_size, group_name):
    return x.new_empty((world_size * x.shape[0], *x.shape[1:]))
