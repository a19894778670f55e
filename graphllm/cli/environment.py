"""Every environment variable graphllm reads, read here once, at the CLI entry, into config fields.

  GRAPHLLM_CACHE_DIR  where `generate` / `serve` / `bench` keep the artifacts they compile
                      (EngineConfig.cache_dir; default ~/.cache/graphllm, or the bench's --work)
  GRAPHLLM_API_KEY    the default of `serve --api-key`
  RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT   set by torchrun: this process is one rank of a
                      tensor-parallel engine spread over torchrun's processes (Environment.torchrun)

Nothing below the CLI reads the environment: the Python API takes the same settings as
arguments (`Engine.from_pretrained(path, cache_dir=...)`). Variables of the libraries underneath
(TORCHINDUCTOR_CACHE_DIR, TRITON_INTERPRET, CUDA_VISIBLE_DEVICES, ...) are theirs, read by them.
"""

import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class TorchrunRank:
    """This process's place in a torchrun launch."""
    rank: int
    world_size: int
    init_method: str  # tcp://MASTER_ADDR:MASTER_PORT (torchrun's rendezvous address)


@dataclass(frozen=True)
class Environment:
    cache_dir: str | None = None
    api_key: str | None = None
    torchrun: TorchrunRank | None = None

    @classmethod
    def read(cls, environ: Mapping[str, str] = os.environ) -> "Environment":
        torchrun = None
        if all(k in environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")):
            torchrun = TorchrunRank(int(environ["RANK"]), int(environ["WORLD_SIZE"]),
                                    f"tcp://{environ['MASTER_ADDR']}:{environ['MASTER_PORT']}")
        return cls(cache_dir=environ.get("GRAPHLLM_CACHE_DIR") or None, api_key=environ.get("GRAPHLLM_API_KEY") or None,
                   torchrun=torchrun)
