"""Quantized decode linears on the GPU: fp8_matmul, int8_matmul, int4_matmul over candidate configs, against
bf16 cuBLAS, skinny_matmul, row-wise _scaled_mm and tinygemm, at the Llama-3-8B linear shapes.

    python benchmarks/quant_kernel_sweep.py OUT.json [BUDGET_S [KERNELS [MS]]]   (H100 / H200; about 4 minutes)

KERNELS: a comma list of fp8q, fp8, int8, int4 (default all); fp8q is fp8_matmul_quantized, x already
float8 as quantize_fp8_activations leaves it (quantized once, outside the timing). MS: row counts, e.g. 1,16.

For each shape (qkv, o_proj, gate_up, down, lm_head) and M in MS, each kernel runs its default config
(CONFIGS or default_config) and the candidates of its M class (int4 past 16 rows: the default only);
every result is checked against the quant_layout reference on the first weight copy before it is timed
(a config that fails to compile, to launch or to match is recorded and skipped). Timings replay a CUDA
graph of calls over distinct weight copies, together STREAM_BYTES (8x the H200's L2), so every call
streams its weight from HBM: the median of TRIALS replays. GB/s counts the weight-side bytes one call
must read (int4: words, scales and zeros); % of copy divides by a device-to-device copy's bandwidth (read
+ write) measured in the same run.

First every candidate is compiled once on a small weight of the same specialisation (precompile, up to half
the budget), so compile time does not eat the timing slots. Candidates then run while the run is inside
its time budget (BUDGET_S, default 200 s, shared out over the (shape, kernel) pairs, unused time carried
forward; defaults and baselines always run); progress goes to stderr, the JSON is rewritten after every
(shape, kernel). Printed last: CONFIGS entries to paste into graphllm/kernels/{fp8,int8,int4}_matmul.py
(also the JSON's configs_text; int4 entries whose K step spans a group, BLOCK_K 256 with G = 128, are
marked: they round the dequantized weight to bf16, int4_matmul's docstring), then one table line per
kernel, shape and M: the best time, its GB/s and % of copy, the default, bf16 cuBLAS and the other
baseline. DEVICE and the module constants may be rebound for a dry run (CPU, Triton's interpreter).
"""

import itertools
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F
import triton

from graphllm.kernels import quant_layout as ql
from graphllm.kernels.fp8_matmul import default_config as fp8_default
from graphllm.kernels.fp8_matmul import fp8_matmul, fp8_matmul_quantized, fp8_quantize_rows
from graphllm.kernels.int4_matmul import default_config as int4_default
from graphllm.kernels.int4_matmul import DOT_MIN_BLOCK_K, int4_matmul, weight_rounds
from graphllm.kernels.int8_matmul import default_config as int8_default
from graphllm.kernels.int8_matmul import int8_matmul, m_bucket, tile_shape
from graphllm.kernels.skinny_matmul import skinny_matmul

SHAPES = {"qkv": (6144, 4096), "o_proj": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
          "lm_head": (128256, 4096)}
MS = (1, 2, 4, 8, 16, 32, 64, 256)
STREAM_BYTES = 400e6
TRIALS = 7
GROUP_SIZE = 128
DTYPE = torch.bfloat16
DEVICE = "cuda"


def log(*args) -> None:
    print(*args, file=sys.stderr, flush=True)


def graph_seconds(calls: list, reps: int = 3) -> float:
    """Median over TRIALS of one call's seconds, from CUDA-graph replays of all calls in sequence."""
    for call in calls:
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    graph.replay()
    times = []
    for _ in range(TRIALS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / reps / len(calls))
    del graph
    return statistics.median(times)


def copy_bandwidth() -> float:
    """Bytes per second of a 1 GiB device-to-device copy, counting the read and the write: `bench`'s measurement
    (eager copies). The copy replayed from a CUDA graph, as this measured before, read 2.76-2.77 TB/s on H200s where
    `bench` measured 4.1-4.2 (2026-11-25 and 2026-11-29; a graph's memcpy node, probably not the copy kernel), so
    the % column was too generous."""
    from graphllm.bench.roofline import measure_bandwidth_tbs
    return measure_bandwidth_tbs(torch.device(DEVICE)) * 1e12


def configs(base: dict, **axes) -> list[dict]:
    """base with every combination of the values in axes (itertools.product)."""
    keys = list(axes)
    return [{**base, **dict(zip(keys, values))} for values in itertools.product(*(axes[k] for k in keys))]


def fp8_candidates(m: int) -> list[dict]:
    if m > 16:
        return [{"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 128, "SWAP_AB": swap, "GROUP_M": 8, "FUSE_QUANT": False,
                 "num_warps": w, "num_stages": s}
                for bm, bn, swap, w, s in [(32, 128, True, 4, 4), (64, 128, True, 4, 4), (64, 128, False, 4, 4),
                                           (128, 128, False, 8, 3), (128, 256, False, 8, 3), (64, 256, False, 8, 3)]]
    swap = {"BLOCK_M": 16, "SWAP_AB": True, "FUSE_QUANT": True, "num_warps": 4}
    out = []
    for bn, bk, s, w in [(64, 256, 4, 4), (64, 128, 6, 4), (128, 256, 3, 4), (128, 128, 4, 4), (128, 256, 3, 8)]:
        out += configs({**swap, "BLOCK_N": bn, "BLOCK_K": bk, "num_stages": s, "num_warps": w}, SPLIT_K=(1, 2, 4))
    # since 2026-11-29 a split tile stores and reads only its real rows' partials (finish_tile): at one row the
    # 16-row tile's splits cost 1/16 of what they did, so they are timed again, up to 8
    out += configs({**swap, "BLOCK_N": 64, "BLOCK_K": 256, "num_stages": 4, "FUSE_QUANT": False},
                   SPLIT_K=(1, 2, 4, 8) if m == 1 else (1, 2, 4))
    out += configs({"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 256, "FUSE_QUANT": False, "num_warps": 4,
                    "num_stages": 4}, SPLIT_K=(1, 2))
    if m == 1:
        out += [{"BLOCK_M": 1, "BLOCK_N": bn, "BLOCK_K": 512, "SPLIT_K": split, "FUSE_QUANT": True, "num_warps": 4,
                 "num_stages": 4} for bn, split in [(16, 1), (32, 4)]]
    return out


def int8_candidates(m: int) -> list[dict]:
    if m > 16:
        return [{"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "SWAP_AB": swap, "GROUP_M": 8, "num_warps": w,
                 "num_stages": s}
                for bm, bn, bk, swap, w, s in [(128, 128, 64, False, 8, 3), (64, 128, 128, False, 4, 4),
                                               (64, 128, 128, True, 8, 3), (32, 128, 128, True, 4, 4),
                                               (128, 256, 64, False, 8, 3)]]
    out = []
    for bn, bk, swap in [(32, 256, False), (64, 256, False), (64, 128, False), (64, 256, True), (128, 128, True)]:
        out += configs({"BLOCK_M": 16, "BLOCK_N": bn, "BLOCK_K": bk, "SWAP_AB": swap, "num_warps": 4,
                        "num_stages": 4}, SPLIT_K=(1, 2, 4))
    if m == 1:
        out += [{"BLOCK_M": 1, "BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": split, "num_warps": 4, "num_stages": 4}
                for bn, bk, split in [(16, 512, 1), (32, 512, 4), (32, 256, 2)]]
    return out


def int4_candidates(m: int) -> list[dict]:
    """One row: the GEMV kernel (GEMV: five shifts for eight nibbles, two column halves per x value) over tile
    widths, warps, pipelining and K splits, then the float32 multiply-add tile summed per word row (ROW_SUM).
    2..16 rows: the 16-row dot tiles that unpack nibble pairs (PAIRS 1: one dot per K step over the
    joined planes; PAIRS 2: a dot per plane), on either MMA side, over tiles of 4 KB..16 KB of words per step
    and K splits 1..8. The default (CONFIGS: the previous
    sweep's best) always runs. Past 16 rows only the default (the op routes those rows to dequantize + cuBLAS)."""
    if m > 16:
        return []
    if m == 1:  # the GEMV kernel's paths: 31 candidates a shape (s42 dropped the tiles that never won since
        # 2026-11-28, ROW_SUM, the previous one-row tile, and what s42's H100 sweep measured slower at every shape:
        # the words asked of the L2 2-4 steps ahead, 7-20% slower, and the float32 GEMV's words as cp.async, 5-14%)
        out = []
        # packed float16 arithmetic (F16: word rows in pairs, 2 or 4 column parts): s42's H100 sweep took it for
        # gate_up (2 parts, 4% faster) and lm_head (4 parts, 2 stages, 3.5%), and the float32 GEMV elsewhere
        for bn, parts, stages in [(256, 4, (1, 2)), (128, 2, (1,))]:  # 2 stages: the loads as cp.async
            out += configs({"BLOCK_M": 1, "BLOCK_N": bn, "BLOCK_K": 128, "num_warps": 4, "GEMV": True, "F16": parts},
                           num_stages=stages, SPLIT_K=(4, 8, 16))
        # the second sweep's winners (2026-11-28): 128 x 128 tiles of 4 or 2 warps (qkv's 2 since s42), unpipelined,
        # 4..16 splits; PREFETCH loads the next step into registers before this step's arithmetic
        for bn, bk, w in [(128, 128, 4), (128, 128, 2), (256, 64, 4)]:
            out += configs({"BLOCK_M": 1, "BLOCK_N": bn, "BLOCK_K": bk, "num_warps": w, "GEMV": True, "num_stages": 1},
                           PREFETCH=(True, False), SPLIT_K=(4, 8, 16))
        # 64-column tiles for the narrow shapes (qkv and o_proj stream at 36-46% of copy on s42's H100, a fixed cost a
        # launch): twice the column tiles at half the K splits, half the split-K partials to write and sum
        out += configs({"BLOCK_M": 1, "BLOCK_N": 64, "BLOCK_K": 128, "GEMV": True, "num_stages": 1},
                       num_warps=(2, 4), SPLIT_K=(4, 8))
        return out
    out = []
    # more programs per SM first: the ncu counters of 2026-11-29 (ncu-quant) read 11-21% of the warp slots
    # active at 16 rows (grids of 256-896 programs of 96-168 registers) with instruction issue 30-51% busy
    for bn, bk, w, s, splits in [(32, 128, 2, 4, (4, 8, 16)), (64, 128, 4, 4, (8, 16)), (64, 64, 4, 6, (8, 16)),
                                 (128, 128, 4, 4, (8, 16)), (32, 256, 4, 3, (4, 8))]:
        out += configs({"BLOCK_M": 16, "BLOCK_N": bn, "BLOCK_K": bk, "num_warps": w, "num_stages": s},
                       SWAP_AB=(False,), SPLIT_K=splits)
        out += configs({"BLOCK_M": 16, "BLOCK_N": bn, "BLOCK_K": bk, "num_warps": w, "num_stages": s, "PAIRS": 1},
                       SWAP_AB=(False,) if bn < 64 else (False, True), SPLIT_K=splits)
    for bn, bk, w, s, splits in [(128, 128, 4, 4, (2, 4, 8)), (64, 128, 4, 4, (4, 8)), (256, 64, 8, 4, (2, 4, 8)),
                                 (128, 64, 4, 6, (4, 8)), (256, 128, 8, 3, (1, 2, 4))]:
        out += configs({"BLOCK_M": 16, "BLOCK_N": bn, "BLOCK_K": bk, "num_warps": w, "num_stages": s, "PAIRS": 1},
                       SWAP_AB=(False, True), SPLIT_K=splits)
    for bn, w, s, splits in [(128, 4, 4, (2, 4, 8)), (64, 4, 4, (4, 8)), (256, 8, 3, (1, 2, 4))]:
        out += configs({"BLOCK_M": 16, "BLOCK_N": bn, "BLOCK_K": 128, "num_warps": w, "num_stages": s, "PAIRS": 2},
                       SWAP_AB=(False, True), SPLIT_K=splits)
    return out


def effective(config: dict, m: int, k: int, dot_min_block_k: int) -> tuple:
    """What a config launches (tile_shape's tiles, the K splits that survive): candidates alike run once."""
    block_m, block_k = tile_shape(m, k, config, dot_min_block_k)
    split = config.get("SPLIT_K", 1) if m <= block_m else 1
    split = triton.cdiv(k, triton.cdiv(triton.cdiv(k, split), block_k) * block_k)
    rest = tuple(sorted((key, v) for key, v in config.items() if key not in ("BLOCK_M", "BLOCK_K", "SPLIT_K")))
    return block_m, block_k, split, rest


class Kernel:
    """One quantized kernel: its weights from a bf16 weight, its call, reference, candidates and default."""

    def __init__(self, name, quantize, call, reference, candidates, default, weight_bytes, dot_min_block_k=16):
        self.name, self.quantize, self.call, self.reference = name, quantize, call, reference
        self.candidates, self.default, self.weight_bytes = candidates, default, weight_bytes
        self.dot_min_block_k = dot_min_block_k
        self.failed: dict[tuple, str] = {}  # effective launch -> why it could not run (compile, resources)


_PREQUANTIZED: dict[int, tuple] = {}  # id(x) -> (x, xq, x_scale); x is kept so its id is not reused


def prequantized(x: torch.Tensor) -> tuple:
    """x's float8 rows and scales, made once outside the timed calls (what the graph's fused norm writes)."""
    if id(x) not in _PREQUANTIZED:
        _PREQUANTIZED[id(x)] = (x, *fp8_quantize_rows(x))
    return _PREQUANTIZED[id(x)][1:]


def fp8q_candidates(m: int) -> list[dict]:
    """fp8_candidates without the in-kernel quantization (fp8q's x is float8 already)."""
    return [c for c in fp8_candidates(m) if not c.get("FUSE_QUANT")] + (
        [{"BLOCK_M": 1, "BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": split, "num_warps": 4, "num_stages": 4}
         for bn, bk, split in [(16, 512, 1), (32, 512, 1), (32, 256, 2), (64, 256, 2), (32, 512, 4)]] if m == 1 else [])


KERNELS = [
    Kernel("fp8q", ql.quantize_fp8_weight,
           lambda x, q, c: fp8_matmul_quantized(*prequantized(x), q[0], q[1], None, x.dtype, c),
           lambda x, q: ql.fp8_linear_reference(x, q[0], q[1]), fp8q_candidates, fp8_default,
           lambda n, k: n * k + 4 * n),
    Kernel("fp8", ql.quantize_fp8_weight, lambda x, q, c: fp8_matmul(x, q[0], q[1], None, None, c),
           lambda x, q: ql.fp8_linear_reference(x, q[0], q[1]), fp8_candidates, fp8_default,
           lambda n, k: n * k + 4 * n),
    Kernel("int8", ql.quantize_int8_weight, lambda x, q, c: int8_matmul(x, q[0], q[1], None, c),
           lambda x, q: ql.int8_linear_reference(x, q[0], q[1]), int8_candidates, int8_default,
           lambda n, k: n * k + 4 * n),
    Kernel("int4", lambda w: ql.quantize_int4_weight(w, GROUP_SIZE),
           lambda x, q, c: int4_matmul(x, q[0], q[1], q[2], None, c),
           lambda x, q: ql.int4_linear_reference(x, q[0], q[1], q[2]), int4_candidates, int4_default,
           lambda n, k: n * k // 2 + 2 * 2 * n * (k // GROUP_SIZE), dot_min_block_k=DOT_MIN_BLOCK_K),
]


def unique_candidates(kernel: Kernel, m: int, k: int) -> list[tuple[tuple, dict]]:
    """(effective launch, config) for the candidates of m rows that launch differently."""
    seen, out = set(), []
    for config in kernel.candidates(m):
        key = effective(config, m, k, kernel.dot_min_block_k)
        if key not in seen:
            seen.add(key)
            out.append((key, config))
    return out


def precompile(deadline: float) -> None:
    """Compile every candidate before the timed sweep (the first shape's time slots would go to the
    compiler): one call per candidate on a [256, K] weight, which specialises as the Llama shapes do (N a
    multiple of 256, the shapes' K). What fails is remembered in kernel.failed and not timed."""
    for kernel, k in itertools.product(KERNELS, sorted({k for _, k in SHAPES.values()})):
        q = tuple(kernel.quantize(torch.randn(256, k, device=DEVICE, dtype=DTYPE)))
        for m in (1, 16, 32):
            x = torch.randn(m, k, device=DEVICE, dtype=DTYPE)
            for key, config in unique_candidates(kernel, m, k):
                if time.time() > deadline:
                    log("precompile: out of time; the rest compiles during the sweep")
                    return
                try:
                    kernel.call(x, q, config)
                    torch.cuda.synchronize()
                except Exception as exc:  # noqa: BLE001 - out of resources, compile errors
                    kernel.failed[key] = f"{type(exc).__name__}: {str(exc)[:200]}"
                    log(f"precompile {kernel.name} {config_text(config)}: {kernel.failed[key][:120]}")
        log(f"precompiled {kernel.name} K={k}")


def copies_of(tensors: tuple, nbytes: int) -> list[tuple]:
    """Distinct copies of a weight's tensors, together at least STREAM_BYTES."""
    count = max(2, int(STREAM_BYTES // nbytes) + 1)
    return [tensors] + [tuple(t.clone() for t in tensors) for _ in range(count - 1)]


def time_call(call, weights: list, ref: torch.Tensor) -> tuple[float | None, float | None, str | None]:
    """(seconds per call, max error relative to max |ref|, error text): checked on weights[0], then timed."""
    try:
        got = call(weights[0]).float()
        torch.cuda.synchronize()
        err = ((got - ref).abs().max() / ref.abs().max().clamp(min=1e-6)).item()
        if not err < 0.03:
            return None, err, "mismatch"
        return graph_seconds([lambda w=w: call(w) for w in weights]), err, None
    except Exception as exc:  # noqa: BLE001 - out of resources, compile errors: record and go on
        return None, None, f"{type(exc).__name__}: {str(exc)[:200]}"


def baselines(m: int, k: int, bf16: list) -> dict:
    """bf16 cuBLAS (F.linear) and, up to 16 rows, skinny_matmul (its default config) over the bf16 copies."""
    x = torch.randn(m, k, device=DEVICE, dtype=DTYPE)
    out = {"bf16_cublas_us": graph_seconds([lambda w=w: F.linear(x, w) for w in bf16]) * 1e6}
    if m <= 16:
        out["bf16_skinny_us"] = graph_seconds([lambda w=w: skinny_matmul(x, w) for w in bf16]) * 1e6
    return out


def scaled_mm_call(x: torch.Tensor):
    """Row-wise torch._scaled_mm with the activation quantization (fp8_quantize_rows) included; rows padded
    to a multiple of 16 (as LOWBIT.md's measurement did)."""
    m = x.shape[0]
    padded = F.pad(x, (0, 0, 0, -m % 16))

    def call(q):
        xq, x_scale = fp8_quantize_rows(padded)
        return torch._scaled_mm(xq, q[0].t(), scale_a=x_scale.view(-1, 1), scale_b=q[1].view(1, -1),
                                out_dtype=x.dtype)[:m]
    return call


def try_us(calls: list) -> float | str:
    """graph_seconds in microseconds, or why the calls failed."""
    try:
        return graph_seconds(calls) * 1e6
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {str(exc)[:200]}"


def tinygemm_weights(n: int, k: int, count: int) -> list | str:
    """torch._weight_int4pack_mm operands (random nibbles, group 128), or why they could not be made."""
    try:
        nibbles = torch.randint(0, 16, (n, k), dtype=torch.int32, device=DEVICE)
        packed = torch._convert_weight_to_int4pack((nibbles[:, ::2] << 4 | nibbles[:, 1::2]).to(torch.uint8), 8)
        scales_zeros = torch.randn(k // GROUP_SIZE, n, 2, device=DEVICE, dtype=DTYPE) / 100
        return [(packed.clone(), scales_zeros.clone()) for _ in range(count)]
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {str(exc)[:200]}"


# int4_mma.py's tensor-core kernel (opt-in, s44): (XSUM, warps, K splits) timed beside the int4 candidates up to 16
# rows (9-16 rows: XSUM always, both 8-row tiles of x from one unpack)
MMA_VARIANTS = tuple(itertools.product((True, False), (4, 8), (4, 8, 16)))


def mma_timings(x: torch.Tensor, weights: list, ref: torch.Tensor) -> list[dict]:
    """int4_mma_matmul over the shuffled copies of weights ((qweight, scales, zeros) each), per MMA_VARIANTS."""
    from graphllm.kernels.int4_mma import int4_mma_matmul, mma_usable, shuffle_int4_mma
    n, k = weights[0][0].shape[1], x.shape[1]
    if not mma_usable(x, n, k, k // weights[0][1].shape[0]):
        return []
    shuffled = [(shuffle_int4_mma(q[0]), q[1], q[2]) for q in weights]
    out = []
    for xsum, warps, split in MMA_VARIANTS:
        if n % (16 * warps) or (x.shape[0] > 8 and not xsum):  # 9-16 rows: XSUM only
            continue
        t, err, why = time_call(lambda wq, a=(xsum, warps, split): int4_mma_matmul(
            x, *wq, split_k=a[2], warps=a[1], xsum=a[0]), shuffled, ref)
        out.append({"xsum": xsum, "warps": warps, "split_k": split, "us": t * 1e6 if t else None, "err": err,
                    "error": why})
    del shuffled
    return out


def config_text(config: dict | None) -> str:
    """BLOCK_MxBLOCK_NxBLOCK_K/SPLIT_K, warps and stages, then the flags set: e.g. 16x64x256/2 w4s4 swap fuse."""
    if config is None:
        return "default"
    c = config
    text = f"{c.get('BLOCK_M', '?')}x{c['BLOCK_N']}x{c['BLOCK_K']}/{c.get('SPLIT_K', 1)}"
    text += f" w{c['num_warps']}s{c['num_stages']}"
    flags = [name for key, name in (("SWAP_AB", "swap"), ("FUSE_QUANT", "fuse"), ("ROW_SUM", "rowsum"),
                                    ("GEMV", "gemv"), ("PREFETCH", "prefetch")) if c.get(key)]
    flags += [f"{name}{c[key]}" for key, name in (("F16", "f16x"), ("PAIRS", "pairs")) if c.get(key)]
    return " ".join([text, *flags] + ([f"g{c['GROUP_M']}"] if "GROUP_M" in c else []))


def sweep_kernel(kernel: Kernel, name: str, n: int, k: int, w: torch.Tensor, base: dict, deadline: float) -> list:
    q = tuple(kernel.quantize(w))
    nbytes = kernel.weight_bytes(n, k)
    weights = copies_of(q, nbytes)
    tiny = tinygemm_weights(n, k, len(weights)) if kernel.name == "int4" else None
    rows = []
    for m in MS:
        x = torch.randn(m, k, device=DEVICE, dtype=DTYPE)
        ref = kernel.reference(x, q).float()
        default = "_scaled_mm" if kernel.name == "fp8" and m > 16 else kernel.default(m, n, k, x.device)
        row = {"kernel": kernel.name, "shape": name, "m": m, "n": n, "k": k, "weight_bytes": nbytes,
               "default_config": default, "candidates": [], **base[m]}
        if kernel.name == "fp8" or kernel.name == "fp8q" and m > 16:
            t, _, why = time_call(scaled_mm_call(x), weights, ref)
            row["scaled_mm_us"] = t * 1e6 if t else why
        if kernel.name == "int4":
            row["tinygemm_us"] = tiny if isinstance(tiny, str) else try_us(
                [lambda p=p: torch._weight_int4pack_mm(x, p[0], GROUP_SIZE, p[1]) for p in tiny])
        if kernel.name == "int4" and m <= 16:
            row["mma"] = mma_timings(x, weights, ref)
            timed = [v["us"] for v in row["mma"] if v["us"]]
            if timed:
                row["mma_best_us"] = min(timed)
        t, err, why = time_call(lambda wq: kernel.call(x, wq, None), weights, ref)
        row["default_us"], row["default_err"] = (t * 1e6 if t else why), err
        timings = [(t, None)] if t else []
        for key, config in unique_candidates(kernel, m, k):
            if time.time() > deadline:
                row["skipped_for_time"] = True
                break
            if key in kernel.failed:
                row["candidates"].append({"config": config, "error": kernel.failed[key]})
                continue
            t, err, why = time_call(lambda wq, c=config: kernel.call(x, wq, c), weights, ref)
            entry = {"config": config, "us": t * 1e6 if t else None, "err": err, "error": why}
            if kernel.name == "int4":
                entry["rounds"] = weight_rounds(m, k, GROUP_SIZE, config)
            row["candidates"].append(entry)
            if t:
                timings.append((t, config))
        if timings:
            best_s, best = min(timings, key=lambda tc: tc[0])
            row |= {"best_us": best_s * 1e6, "best_config": best, "best_gb_s": nbytes / best_s / 1e9}
        rows.append(row)
        log(f"{kernel.name} {name} M={m}: default {row['default_us']} us, best {row.get('best_us')} us "
            f"({config_text(row.get('best_config'))}), bf16 cuBLAS {row['bf16_cublas_us']:.1f} us")
    del weights, tiny
    torch.cuda.empty_cache()
    return rows


def configs_text(report: dict) -> str:
    """CONFIGS entries to paste, (m_bucket, N, K): config, where a candidate beat the default."""
    blocks = []
    for kernel in KERNELS:
        lines = [f"    ({m_bucket(r['m'])}, {r['n']}, {r['k']}): {r['best_config']!r},"
                 + ("  # rounds W to bf16" if kernel.name == "int4" and weight_rounds(r["m"], r["k"], GROUP_SIZE,
                                                                                      r["best_config"]) else "")
                 for r in report["rows"] if r["kernel"] == kernel.name and r.get("best_config")]
        blocks.append(f"# graphllm/kernels/{kernel.name}_matmul.py\nCONFIGS = {{\n" + "\n".join(lines) + "\n}")
    return "\n".join(blocks)


def print_table(report: dict) -> None:
    """One line per kernel, shape and M (us per call; GB/s and % of copy of the best)."""
    copy = report["copy_gb_s"]
    us = lambda v: f"{v:.1f}" if isinstance(v, float) else "-"  # noqa: E731 - a failed call is a string
    print(f"copy {copy:.0f} GB/s on {report['device']}; us per call, weights from HBM; other: scaled_mm (fp8), "
          "tinygemm (int4), skinny bf16; mma: int4_mma's tensor-core kernel, best variant (int4, up to 16 rows)")
    print("kern shape     M    best  GB/s %copy default  cuBLAS       other     mma  best config")
    for r in report["rows"]:
        other = r.get("scaled_mm_us", r.get("tinygemm_us", r.get("bf16_skinny_us")))
        gb_s = r.get("best_gb_s", 0.0)
        print(f"{r['kernel']:<4} {r['shape']:<7} {r['m']:>3} {us(r.get('best_us')):>7} {gb_s:5.0f} "
              f"{100 * gb_s / copy:4.0f}% {us(r['default_us']):>7} {us(r['bf16_cublas_us']):>7} {us(other):>11} "
              f"{us(r.get('mma_best_us')):>7}  "
              f"{config_text(r.get('best_config'))}")


def main() -> None:
    out_path, budget = sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 200.0
    global KERNELS, MS
    if len(sys.argv) > 3:  # kernels to sweep (default: all), e.g. fp8q
        KERNELS = [k for k in KERNELS if k.name in sys.argv[3].split(",")]
    if len(sys.argv) > 4:  # row counts (default: MS), e.g. 1,2,4,8,16
        MS = tuple(int(m) for m in sys.argv[4].split(","))
    start = time.time()
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "stream_bytes": STREAM_BYTES, "group_size": GROUP_SIZE, "budget_s": budget, "rows": []}
    report["copy_gb_s"] = copy_bandwidth() / 1e9
    log(f"copy bandwidth {report['copy_gb_s']:.0f} GB/s")
    precompile(start + budget / 2)
    report["precompile_s"] = time.time() - start
    sweep_start, slots = time.time(), len(SHAPES) * len(KERNELS)
    for i, (name, (n, k)) in enumerate(SHAPES.items()):
        w = torch.randn(n, k, device=DEVICE, dtype=DTYPE) / k ** 0.5
        bf16 = [w] + [w.clone() for _ in range(max(1, int(STREAM_BYTES // (n * k * 2))))]
        base = {m: baselines(m, k, bf16) for m in MS}
        del bf16
        for j, kernel in enumerate(KERNELS):
            # each (shape, kernel) pair's share of what is left of the budget, unused time carried forward
            deadline = sweep_start + (start + budget - sweep_start) * (i * len(KERNELS) + j + 1) / slots
            report["rows"] += sweep_kernel(kernel, name, n, k, w, base, deadline)
            with open(out_path, "w") as f:  # what is done so far survives a later failure
                json.dump(report, f, indent=1)
        del w
        torch.cuda.empty_cache()
    report["elapsed_s"] = time.time() - start
    report["configs_text"] = configs_text(report)
    with open(out_path, "w") as f:
        json.dump(report, f, indent=1)
    print(report["configs_text"])  # also in the JSON: configs_text
    print_table(report)
    log(f"done in {report['elapsed_s']:.0f} s")


if __name__ == "__main__":
    main()
