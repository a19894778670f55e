"""How long the server's event loop spends parsing and validating a large chat body, before and after
`graphllm serve`'s gc.freeze() of the start-up heap (cli/serve.py freeze_startup_heap), with the demo engine
loaded in the process as the server has it.

    PYTHONPATH=. python benchmarks/body_parse.py     # CPU is enough: the parse does not touch the model
"""

import gc
import json
import time

from graphllm import Engine, EngineConfig
from graphllm.cli.serve import freeze_startup_heap
from graphllm.server.protocol import ChatCompletionRequest


def parse_seconds(body: bytes) -> float:
    """FastAPI's path for a JSON body: json.loads, then the request model's validation."""
    start = time.perf_counter()
    ChatCompletionRequest.model_validate(json.loads(body))
    return time.perf_counter() - start


def main() -> None:
    engine = Engine(EngineConfig())  # the demo model
    print(f"objects the collector tracks with the engine loaded: {len(gc.get_objects()):,}")
    bodies = {
        "100k messages of 120 characters": [{"role": "user", "content": "x" * 120} for _ in range(100_000)],
        "450k one-word messages": [{"role": "user", "content": "x"} for _ in range(450_000)],
    }
    bodies = {name: json.dumps({"model": "m", "messages": msgs}).encode() for name, msgs in bodies.items()}
    before = {name: [parse_seconds(body) for _ in range(3)] for name, body in bodies.items()}
    freeze_startup_heap()
    for name, body in bodies.items():
        after = [parse_seconds(body) for _ in range(3)]
        print(f"{name} ({len(body) / 2**20:.1f} MiB): before {', '.join(f'{t:.2f}' for t in before[name])} s; "
              f"after the freeze {', '.join(f'{t:.2f}' for t in after)} s")
    del engine


if __name__ == "__main__":
    main()
