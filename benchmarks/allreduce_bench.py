"""All-reduce latency at decode sizes: NCCL against torch symmetric-memory one-shot and two-shot.

Issue 16 (tensor parallelism). Every rank all-reduces bf16 activations of hidden size 4096
(Llama-3-8B), `rows` x 4096 for rows in ROWS, with each method, eagerly and captured in a CUDA
graph (decode replays graphs: ITERS all-reduces in one graph, replayed and divided):

    nccl           dist.all_reduce, in place
    funcol         torch.ops._c10d_functional.all_reduce + wait_tensor (what ShardTP puts in graphs)
    one_shot       torch.ops.symm_mem.one_shot_all_reduce on a rendezvoused symmetric buffer
    one_shot_copy  torch.ops.symm_mem.one_shot_all_reduce_copy: the same kernel copying the input
                   in from an ordinary tensor (a matmul output is not in symmetric memory)
    two_shot       torch.ops.symm_mem.two_shot_all_reduce_, in place on the symmetric buffer

Each result on one random input (an eager call, or one replay of a one-call graph) is compared
with dist.all_reduce's (max_abs_diff); a failing method records its error and the rest still run.
NVLink multicast stays off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1): no multimem op.

    torchrun --nproc-per-node N benchmarks/allreduce_bench.py OUT.json [--iters 50] [--rows 1,8,64]

Rank 0 writes OUT.json, a list of {method, rows, bytes, world_size, graph, us_per_call,
max_abs_diff, error}, and prints a table in microseconds per all-reduce (rank 0's clock).
"""

import argparse
import json
import os
from datetime import timedelta
from typing import Callable

import torch
import torch.distributed as dist

HIDDEN = 4096
ROWS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 8192]
WARMUP = 5
REPLAYS = 5
COLUMNS = [("nccl", False, "nccl eager"), ("nccl", True, "nccl graph"), ("funcol", True, "funcol graph"),
           ("one_shot", True, "one-shot"), ("one_shot_copy", True, "one-shot copy"), ("two_shot", True, "two-shot")]

Step = Callable[[], torch.Tensor]


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", help="JSON file that rank 0 writes")
    ap.add_argument("--iters", type=int, default=50, help="all-reduces per timed loop / captured graph")
    ap.add_argument("--rows", default=",".join(map(str, ROWS)), help="comma-separated row counts")
    args = ap.parse_args()
    args.rows = [int(r) for r in args.rows.split(",")]
    return args


def init_distributed() -> torch.device:
    # Multicast off before NCCL or symmetric memory start: it can take shared GPUs out of service.
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
    os.environ["NVSHMEM_DISABLE_NVLS"] = "1"
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device, timeout=timedelta(seconds=120))
    return device


def symmetric_buffer(numel: int, device: torch.device, group: str) -> torch.Tensor:
    """One bf16 buffer in symmetric memory, rendezvoused once; every size uses a prefix of it."""
    import torch.distributed._symmetric_memory as symm_mem

    buf = symm_mem.empty(numel, dtype=torch.bfloat16, device=device)
    symm_mem.rendezvous(buf, group)
    return buf


def preparers(group: str, symm: torch.Tensor | None, symm_error: str) -> dict[str, Callable[[torch.Tensor], Step]]:
    """Method name -> prepare(x): puts x where the method reads it and returns one all-reduce step."""
    ops, funcol = torch.ops.symm_mem, torch.ops._c10d_functional

    def symm_copy(x: torch.Tensor) -> torch.Tensor:
        if symm is None:
            raise RuntimeError(f"no symmetric buffer: {symm_error}")
        view = symm[: x.numel()].view_as(x)  # [rows, HIDDEN] at offset 0 of the rendezvoused buffer
        view.copy_(x)
        return view

    def nccl(x: torch.Tensor) -> Step:
        buf = x.clone()

        def step() -> torch.Tensor:
            dist.all_reduce(buf)
            return buf
        return step

    def one_shot(x: torch.Tensor) -> Step:
        view = symm_copy(x)
        return lambda: ops.one_shot_all_reduce(view, "sum", group)

    def one_shot_copy(x: torch.Tensor) -> Step:
        view = symm_copy(x)
        return lambda: ops.one_shot_all_reduce_copy(view, x, "sum", group)

    def two_shot(x: torch.Tensor) -> Step:
        view = symm_copy(x)
        return lambda: ops.two_shot_all_reduce_(view, "sum", group)

    return {"nccl": nccl, "funcol": lambda x: lambda: funcol.wait_tensor(funcol.all_reduce(x, "sum", group)),
            "one_shot": one_shot, "one_shot_copy": one_shot_copy, "two_shot": two_shot}


def warm_up(step: Step) -> None:
    """A few calls on a side stream, as before a capture: lazy setup happens here, not in a graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(WARMUP):
            step()
    torch.cuda.current_stream().wait_stream(stream)


def capture(step: Step, iters: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """A graph of `iters` calls of step, and the last call's output (in the graph's pool)."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(iters):
            out = step()
    return graph, out


def elapsed_us(fn: Callable[[], object], times: int) -> float:
    """Microseconds per call of fn, timed with CUDA events after all ranks line up."""
    torch.cuda.synchronize()
    dist.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(times):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / times


def measure(method: str, prepare: Callable[[torch.Tensor], Step], x: torch.Tensor, ref: torch.Tensor,
            graph: bool, iters: int) -> dict:
    """One record: the check against ref, then the time per call; an exception becomes `error`."""
    record = {"method": method, "rows": x.shape[0], "bytes": x.numel() * x.element_size(),
              "world_size": dist.get_world_size(), "graph": graph, "us_per_call": None,
              "max_abs_diff": None, "error": None}
    try:
        torch.cuda.synchronize()
        dist.barrier()
        warm_up(prepare(x))
        step = prepare(x)  # fresh input: the warm-up reduced in-place buffers
        if graph:
            one, out = capture(step, 1)
            one.replay()
        else:
            out = step()
        torch.cuda.synchronize()
        record["max_abs_diff"] = (out.float() - ref.float()).abs().max().item()
        if graph:
            many, _ = capture(step, iters)
            many.replay()
            record["us_per_call"] = elapsed_us(many.replay, REPLAYS) / iters
        else:
            record["us_per_call"] = elapsed_us(step, iters)
    except Exception as e:  # noqa: BLE001 - one failing method must not stop the others
        record["error"] = f"{type(e).__name__}: {e}"[:500]
    return record


def print_table(records: list[dict]) -> None:
    cells = {(r["method"], r["graph"], r["rows"]): r for r in records}
    print("rows | bytes | " + " | ".join(name for _, _, name in COLUMNS) + "  (us per all-reduce)")
    for rows in sorted({r["rows"] for r in records}):
        line = [str(rows), str(rows * HIDDEN * 2)]
        for method, graph, _ in COLUMNS:
            r = cells.get((method, graph, rows))
            line.append("-" if r is None else "err" if r["error"] else f"{r['us_per_call']:.1f}")
        print(" | ".join(line))
    errors = {(r["method"], r["graph"]): r["error"] for r in records if r["error"]}
    for (method, graph), error in errors.items():
        print(f"{method} ({'graph' if graph else 'eager'}): {error}")


def main() -> None:
    args = parse_args()
    device = init_distributed()
    rank, group = dist.get_rank(), dist.group.WORLD.group_name
    symm, symm_error = None, ""
    try:
        symm = symmetric_buffer(max(args.rows) * HIDDEN, device, group)
    except Exception as e:  # noqa: BLE001 - NCCL rows are still worth having
        symm_error = f"{type(e).__name__}: {e}"
    methods = preparers(group, symm, symm_error)
    records = []
    for rows in args.rows:
        gen = torch.Generator(device).manual_seed(1000 * rank + rows)
        x = torch.randn(rows, HIDDEN, generator=gen, device=device, dtype=torch.bfloat16)  # [rows, HIDDEN]
        ref = x.clone()
        dist.all_reduce(ref)
        iters = args.iters if x.nbytes <= 4 << 20 else max(5, args.iters // 5)  # keeps 64 MiB rows short
        for method, prepare in methods.items():
            for graph in (False, True):
                records.append(measure(method, prepare, x, ref, graph, iters))
    del methods, symm
    torch.cuda.synchronize()
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(records, f, indent=1)
        print(f"torch {torch.__version__}, world size {records[0]['world_size']}, wrote {args.out}")
        print_table(records)


if __name__ == "__main__":
    main()
