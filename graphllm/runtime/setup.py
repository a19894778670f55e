"""Builds the runtime pieces from an EngineConfig: model, tokenizer, KV cache, scheduler, runner.

Facts found here (device, dtype, KV blocks, EOS ids, max_model_len) go into RuntimeState;
the EngineConfig is never mutated.
"""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn

from graphllm.config import EngineConfig
from graphllm.models.config import ModelConfig
from graphllm.models.loader import load_model, read_hf_config
from graphllm.runtime.kv_cache import BlockPool, allocate_kv_caches, kv_bytes_per_block
from graphllm.runtime.model_runner import ModelRunner
from graphllm.runtime.scheduler import Scheduler

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
CPU_KV_CACHE_GIB = 4.0
GPU_MEMORY_UTILIZATION = 0.9


@dataclass(frozen=True)
class RuntimeState:
    model_path: Path
    device: torch.device
    dtype: torch.dtype
    max_model_len: int
    num_kv_blocks: int
    kv_cache_bytes: int
    eos_token_ids: frozenset[int]


class Runtime(NamedTuple):
    model: nn.Module
    tokenizer: Any
    state: RuntimeState
    pool: BlockPool
    scheduler: Scheduler
    runner: ModelRunner


def resolve_model_path(config: EngineConfig) -> Path:
    if config.model is not None:
        return Path(config.model).expanduser()
    from graphllm.demo import DEMO_MODEL_DIR
    return Path(DEMO_MODEL_DIR)


def resolve_device(config: EngineConfig) -> torch.device:
    if config.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(config.device)


def resolve_dtype(config: EngineConfig, hf: dict[str, Any], device: torch.device) -> torch.dtype:
    if config.dtype != "auto":
        return getattr(torch, config.dtype)
    if device.type == "cpu":
        return torch.float32
    saved = hf.get("dtype") or hf.get("torch_dtype")
    return torch.float16 if saved == "float16" else torch.bfloat16


def load_tokenizer(path: Path):
    if not any((path / f).is_file() for f in TOKENIZER_FILES):
        return None
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(path)


def eos_token_ids(path: Path, model_config: ModelConfig, tokenizer) -> frozenset[int]:
    ids = set(model_config.eos_token_ids)
    gen_file = path / "generation_config.json"
    if gen_file.is_file():
        eos = json.loads(gen_file.read_text()).get("eos_token_id")
        ids |= set(eos if isinstance(eos, list) else [] if eos is None else [eos])
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return frozenset(ids)


def resolve_max_model_len(config: EngineConfig, model_config: ModelConfig) -> int:
    limit = model_config.max_position_embeddings
    if config.max_model_len is None:
        return limit
    if config.max_model_len > limit:
        raise ValueError(f"max_model_len={config.max_model_len} exceeds the model's "
                         f"max_position_embeddings={limit}")
    return config.max_model_len


def resolve_num_blocks(config: EngineConfig, model_config: ModelConfig, dtype: torch.dtype,
                       device: torch.device, max_model_len: int) -> int:
    if config.num_kv_blocks is not None:
        num_blocks = config.num_kv_blocks
    else:
        per_block = kv_bytes_per_block(model_config, config.block_size, dtype)
        wanted = -(-config.max_num_seqs * max_model_len // config.block_size)
        num_blocks = min(wanted, kv_cache_budget(config, device) // per_block)
    if num_blocks * config.block_size < max_model_len:
        raise ValueError(f"the KV cache holds {num_blocks * config.block_size} tokens, fewer than "
                         f"max_model_len={max_model_len}: give more KV memory or a smaller max_model_len")
    return num_blocks


def kv_cache_budget(config: EngineConfig, device: torch.device) -> int:
    if config.kv_cache_memory_gib is not None:
        return int(config.kv_cache_memory_gib * 2**30)
    if device.type == "cpu":
        return int(CPU_KV_CACHE_GIB * 2**30)
    free, total = torch.cuda.mem_get_info(device)
    return int(free - (1 - GPU_MEMORY_UTILIZATION) * total)


def build_runtime(config: EngineConfig) -> Runtime:
    path = resolve_model_path(config)
    device = resolve_device(config)
    dtype = resolve_dtype(config, read_hf_config(path), device)
    model, model_config = load_model(path, dtype, device)
    tokenizer = load_tokenizer(path)
    max_model_len = resolve_max_model_len(config, model_config)
    num_blocks = resolve_num_blocks(config, model_config, dtype, device, max_model_len)
    kv_caches = allocate_kv_caches(model_config, num_blocks, config.block_size, dtype, device)
    kv_bytes = sum(c.numel() * c.element_size() for c in kv_caches)
    torch.manual_seed(config.seed)
    state = RuntimeState(path, device, dtype, max_model_len, num_blocks, kv_bytes,
                         eos_token_ids(path, model_config, tokenizer))
    pool = BlockPool(num_blocks, config.block_size)
    scheduler = Scheduler(pool, config.max_num_seqs, config.max_num_batched_tokens)
    runner = ModelRunner(model, kv_caches, config.block_size, device)
    return Runtime(model, tokenizer, state, pool, scheduler, runner)
