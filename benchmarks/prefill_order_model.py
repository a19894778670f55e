"""A model of the prefill kernel's program order (not a measurement): greedy dispatch of its programs, in grid
order, onto SLOTS resident programs, each costing its KV tiles + 1 (the query tile's load and store). Prints the
makespan, in tile times, of the old order (tiles fastest, lightest first, one KV head after another) and of
heaviest_first's (KV heads fastest, the last tiles first), with max(total / SLOTS, heaviest) as a lower bound.

    python benchmarks/prefill_order_model.py
"""

import heapq

SLOTS = 264  # 132 SMs x 2 resident programs of the 64 x 64 tile
KV_HEADS = 8


def makespan(costs: list[float], slots: int = SLOTS) -> float:
    free = [0.0] * slots
    end = 0.0
    for c in costs:
        start = heapq.heappop(free)
        end = max(end, start + c)
        heapq.heappush(free, start + c)
    return end


def orders(prompts: int, length: int, block_q: int = 16, block_n: int = 64) -> tuple[list, list]:
    tiles = -(-length // block_q)
    per_prompt = [1 + -(-min((i + 1) * block_q, length) // block_n) for i in range(tiles)]
    sequence = per_prompt * prompts
    old = [c for _ in range(KV_HEADS) for c in sequence]
    heavy_first = [c for c in reversed(sequence) for _ in range(KV_HEADS)]
    return old, heavy_first


def main() -> None:
    print("prompts x tokens | old order | heaviest first | lower bound")
    for prompts, length in [(1, 900), (1, 2048), (8, 1024), (16, 512), (1, 8192)]:
        old, heavy_first = orders(prompts, length)
        bound = max(sum(old) / SLOTS, max(old))
        print(f"{prompts} x {length} | {makespan(old):.0f} | {makespan(heavy_first):.0f} | {bound:.0f}")


if __name__ == "__main__":
    main()
