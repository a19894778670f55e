"""The benchmarks' ceilings: the weights a decode step reads, the device's copy bandwidth and matmul rate, and
the floor of a whole throughput workload.

`bench latency` sets one decode step against the bytes of its weights (`decode_weight_bytes`) over the copy
bandwidth (`measure_bandwidth_tbs`). `bench throughput` sets a whole workload against its roofline
(`workload_roofline`): the matmul FLOPs every token needs at the measured matmul rate (`measure_gemm_tflops`),
plus the KV-cache bytes its attention must move at the copy bandwidth. The two terms add (a step runs its
attention and its matmuls one after the other), and both count only what any engine must do:

- FLOPs: 2 x (the parameters a token reads, less the LM head) for every token that runs through the model
  (its prompt, and each generated token but the last), 2 x the LM head's parameters for each sampled token,
  and attention's 2 x (qk + pv width) per key a token attends to, per layer (windows cut it);
- KV bytes: each decode token reads its sequence's cached keys and values (a window's worth where a layer has
  one), each prompt's keys are read once by its prefill, and every token's are written once.

Weight reads are left out (at the batch sizes that dominate such a workload the matmuls are compute-bound), and
so are preemption's recomputation, padding and sampling: the result is a floor no schedule beats.

`schedule_floor` is the floor of the schedule a run took, step by step from its step table: each step's matmuls
at the matmul rate or its weight read at the copy bandwidth, whichever is longer, plus its KV reads (each
sequence's context, once) and writes. It counts the weight reads of small steps that the roofline leaves out, so
it says how near the kernels and the host came to what that schedule allows.
"""

import argparse
import json
import math
import statistics
import struct
from pathlib import Path

import torch

from graphllm.models.config import ModelConfig

SAFETENSORS_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                     "F8_E4M3": 1, "F8_E5M2": 1, "BOOL": 1}


def add_ceiling_args(p: argparse.ArgumentParser, gemm: bool = False) -> None:
    p.add_argument("--bandwidth-tbs", type=float, help="memory bandwidth in TB/s for the ceiling (default: measured)")
    if gemm:
        p.add_argument("--gemm-tflops", type=float,
                       help="matmul rate in TFLOP/s for the roofline (default: measured, 8192^3 in the model dtype; "
                            "float8 under --quantization fp8)")


def safetensors_entries(model_dir: Path) -> dict[str, dict]:
    """Tensor name -> {"dtype", "shape"} from the headers of every *.safetensors file (no data read)."""
    entries = {}
    for file in sorted(model_dir.glob("*.safetensors")):
        with open(file, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        entries.update({k: v for k, v in header.items() if k != "__metadata__"})
    return entries


def decode_weight_bytes(model_dir: Path, dtype: torch.dtype | None) -> dict:
    """Bytes one decode step reads from the weights: at `dtype` (a model folder the engine casts),
    or as stored (None: an artifact's weights.safetensors, quantized tensors at their own width).

    The input embedding is a gather of B rows, not a read of the matrix; tied embeddings (no
    lm_head.weight in the folder) are read whole by the LM head, so they count. A mixture-of-experts
    model's token reads only the experts it routes to: expert tensors (".experts." in the name, stacked
    or one per expert) count at num_experts_per_tok / num_experts (n_routed_experts: DeepSeek), the bytes of one
    sequence's step; DeepSeek's shared experts (".shared_experts.") are read whole. lm_head_parameters: the
    LM head's matrix (the embedding, when tied).
    """
    entries = safetensors_entries(model_dir)
    numel = {name: math.prod(e["shape"]) for name, e in entries.items()}
    size = {name: dtype.itemsize if dtype else SAFETENSORS_BYTES[e["dtype"]] for name, e in entries.items()}
    tied = not any(".lm_head." in f".{name}" for name in entries)
    embed = [name for name in entries if name.endswith("embed_tokens.weight")]
    read = [name for name in entries if tied or name not in embed]
    head = [name for name in entries if (name in embed if tied else f".{name}".endswith(".lm_head.weight"))]
    hf = json.loads((model_dir / "config.json").read_text())
    experts = hf.get("num_experts") or hf.get("num_local_experts") or hf.get("n_routed_experts")  # DeepSeek's name
    routed = hf["num_experts_per_tok"] / experts if experts else 1.0
    share = {name: routed if ".experts." in name else 1.0 for name in read}
    return {"parameters": sum(numel.values()), "decode_read_parameters": round(sum(numel[n] * share[n] for n in read)),
            "lm_head_parameters": sum(numel[n] for n in head[:1]),
            "tied_embeddings": tied, "routed_expert_share": routed if experts else None,
            "decode_read_bytes": round(sum(numel[n] * size[n] * share[n] for n in read))}


def engine_weight_bytes(state, model_dir: Path) -> dict:
    """decode_weight_bytes of what an engine runs (state: its RuntimeState): an artifact's weights as stored
    (quantized tensors at their width), else model_dir's at the engine's dtype."""
    if (state.model_path / "weights.safetensors").is_file():  # an artifact
        return decode_weight_bytes(state.model_path, None)
    return decode_weight_bytes(model_dir, state.dtype)


def _median_seconds(fn, reps: int) -> float:
    """Median of reps timed calls of fn (CUDA events), after one warm-up call."""
    fn()
    seconds = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        seconds.append(start.elapsed_time(end) / 1e3)
    return statistics.median(seconds)


def measure_bandwidth_tbs(device: torch.device, gib: float = 1.0, reps: int = 20) -> float:
    """Median device-to-device copy bandwidth, read + write counted, in TB/s."""
    n = int(gib * 2**30)
    src, dst = (torch.empty(n, dtype=torch.uint8, device=device) for _ in range(2))
    seconds = _median_seconds(lambda: dst.copy_(src), reps)
    src = dst = None
    torch.cuda.empty_cache()
    return 2 * n / seconds / 1e12


def measure_gemm_tflops(device: torch.device, dtype: torch.dtype, n: int = 8192, reps: int = 10) -> float:
    """Median rate of an n x n x n matmul of random (not zero) `dtype` matrices, in TFLOP/s."""
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    seconds = _median_seconds(lambda: a @ b, reps)
    a = b = None
    torch.cuda.empty_cache()
    return 2 * n**3 / seconds / 1e12


def measure_fp8_gemm_tflops(device: torch.device, n: int = 8192, reps: int = 10) -> float:
    """Median rate of an n x n x n float8 e4m3 matmul with row-wise scales and bfloat16 out (torch._scaled_mm,
    what fp8 W8A8 linears run past the small-M tiles, with their fast accumulation: kernels/fp8_matmul.py), in
    TFLOP/s."""
    from graphllm.kernels.fp8_matmul import FAST_ACCUM
    a = torch.randn(n, n, device=device).to(torch.float8_e4m3fn)
    b = torch.randn(n, n, device=device).to(torch.float8_e4m3fn)  # [N, K] row-major: b.t() is column-major
    scale_a, scale_b = torch.rand(n, 1, device=device) + 0.5, torch.rand(1, n, device=device) + 0.5
    seconds = _median_seconds(lambda: torch._scaled_mm(a, b.t(), scale_a=scale_a, scale_b=scale_b,
                                                       out_dtype=torch.bfloat16, use_fast_accum=FAST_ACCUM),
                             reps)
    a = b = None
    torch.cuda.empty_cache()
    return 2 * n**3 / seconds / 1e12


def bandwidth(args: argparse.Namespace, device: torch.device) -> dict:
    """{"bandwidth_tbs", "source"}: the flag, else measured on a GPU, else None."""
    if args.bandwidth_tbs:
        return {"bandwidth_tbs": args.bandwidth_tbs, "source": "--bandwidth-tbs"}
    if device.type == "cuda":
        return {"bandwidth_tbs": measure_bandwidth_tbs(device),
                "source": "measured: 1 GiB device-to-device copy, read + write, median of 20"}
    return {"bandwidth_tbs": None, "source": "not measured on CPU"}


def device_ceilings(args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> dict:
    """bandwidth() plus {"gemm_tflops", "gemm_source"}: --gemm-tflops, else measured on a GPU, else None.
    The matmul rate is that of the linears the engine runs: float8's under --quantization fp8 (W8A8: twice
    bf16's peak; the weight-only schemes dequantize into `dtype` matmuls at large M). Run it before the
    engine's KV cache takes the free memory."""
    out = bandwidth(args, device)
    if args.gemm_tflops:
        return out | {"gemm_tflops": args.gemm_tflops, "gemm_source": "--gemm-tflops"}
    if device.type != "cuda":
        return out | {"gemm_tflops": None, "gemm_source": "not measured on CPU"}
    if getattr(args, "quantization", None) == "fp8":
        return out | {"gemm_tflops": measure_fp8_gemm_tflops(device), "gemm_source":
                      "measured: 8192^3 float8 e4m3 torch._scaled_mm, row-wise scales, random data, median of 10"}
    return out | {"gemm_tflops": measure_gemm_tflops(device, dtype),
                  "gemm_source": f"measured: 8192^3 {str(dtype)[6:]} matmul of random data, median of 10"}


def keys_attended(length: int, window: int) -> int:
    """Sum over positions p < length of the keys position p attends to: p + 1, at most `window` (0: no window)."""
    if window <= 0 or length <= window:
        return length * (length + 1) // 2
    return window * (window + 1) // 2 + (length - window) * window


def decode_context_reads(prompt: int, generated: int, window: int) -> int:
    """Tokens of cache that the decode steps of one request read: its generated tokens after the first each read
    their context (prompt + j tokens at step j), a window's worth at most."""
    if generated <= 1:
        return 0
    return keys_attended(prompt + generated - 1, window) - keys_attended(prompt, window)


def attention_widths(config: ModelConfig) -> int:
    """qk + pv width of one token's attention over one key, summed over the heads."""
    if config.is_mla:
        return config.num_attention_heads * (config.qk_nope_head_dim + config.qk_rope_head_dim + config.v_head_dim)
    return 2 * config.num_attention_heads * config.head_dim


def workload_roofline(requests: list[tuple[int, int]], weights: dict, config: ModelConfig,
                      kv_bytes_per_token: float, gemm_tflops: float | None, bandwidth_tbs: float | None) -> dict:
    """The floor of a throughput workload (this module's docstring). requests: (prompt tokens, generated tokens)
    each; weights: decode_weight_bytes(); kv_bytes_per_token: cache bytes of one token, all layers."""
    body = weights["decode_read_parameters"] - weights["lm_head_parameters"]
    layers = config.num_hidden_layers
    windows = [config.window_of(layer) for layer in range(layers)]
    matmul = sum(2 * body * (p + g - 1) + 2 * weights["lm_head_parameters"] * g for p, g in requests)
    keys = sum(keys_attended(p + g - 1, w) for p, g in requests for w in windows)  # over layers
    attention = 2 * attention_widths(config) * keys
    per_layer = kv_bytes_per_token / layers
    reads = sum(decode_context_reads(p, g, w) + p for p, g in requests for w in windows)
    kv_bytes = per_layer * reads + kv_bytes_per_token * sum(p + g - 1 for p, g in requests)
    out = {"matmul_flop": matmul, "attention_flop": attention, "kv_bytes": kv_bytes,
           "output_tokens": sum(g for _, g in requests)}
    if not (gemm_tflops and bandwidth_tbs):
        return out | {"compute_s": None, "kv_s": None, "floor_s": None, "output_tok_s": None}
    compute_s, kv_s = (matmul + attention) / (gemm_tflops * 1e12), kv_bytes / (bandwidth_tbs * 1e12)
    return out | {"compute_s": compute_s, "kv_s": kv_s, "floor_s": compute_s + kv_s,
                  "output_tok_s": out["output_tokens"] / (compute_s + kv_s)}


def wall_split(step_breakdown: dict, wall_s: float) -> dict:
    """Seconds and share of the wall time spent in prefill-carrying (mixed) steps and in decode steps: by the
    GPU timeline (gpu_ms, workload.StepTimer's events) where the breakdown has it, else by the host's step
    totals (which, under async scheduling, put each step's GPU time into the step after it)."""
    out = {}
    for phase, d in step_breakdown.items():
        seconds = d["steps"] * d.get("gpu_ms", d["total_ms"]) / 1e3
        out[phase] = {"steps": d["steps"], "seconds": seconds, "share": seconds / wall_s if wall_s else None,
                      "source": "gpu" if "gpu_ms" in d else "host"}
    return out


def schedule_floor(table: dict[str, list], weights: dict, config: ModelConfig, kv_bytes_per_token: float,
                   gemm_tflops: float | None, bandwidth_tbs: float | None) -> dict | None:
    """The floor of a run's own schedule (this module's docstring), from its step table (columns seqs,
    decode_seqs, new_tokens, context_tokens). Attention's FLOPs and sampling are left out, so it stays a floor;
    None without both rates, or for a model with windows (the table's context sums would overstate their
    reads)."""
    windowed = any(config.window_of(layer) > 0 for layer in range(config.num_hidden_layers))
    if not (gemm_tflops and bandwidth_tbs) or windowed or "new_tokens" not in table:
        return None
    flops, bytes_per_s = gemm_tflops * 1e12, bandwidth_tbs * 1e12
    body = weights["decode_read_parameters"] - weights["lm_head_parameters"]
    weight_s = weights["decode_read_bytes"] / bytes_per_s
    prompts = table.get("prefill_tokens") or [0] * len(table["new_tokens"])
    steps = zip(table["decode_seqs"], table["new_tokens"], table["context_tokens"], prompts)
    phases = {phase: {"steps": 0, "matmul_or_weights_s": 0.0, "kv_s": 0.0} for phase in ("prefill", "decode")}
    for decodes, new, context, prompt in steps:  # decodes: rows sampled at least (a finishing prompt samples too)
        phase = phases["prefill" if prompt else "decode"]
        phase["steps"] += 1
        phase["matmul_or_weights_s"] += max((2 * body * new + 2 * weights["lm_head_parameters"] * decodes) / flops,
                                            weight_s)
        phase["kv_s"] += kv_bytes_per_token * (context + new) / bytes_per_s
    for phase in phases.values():
        phase["floor_s"] = phase["matmul_or_weights_s"] + phase["kv_s"]
    matmul_s, kv_s = (sum(p[k] for p in phases.values()) for k in ("matmul_or_weights_s", "kv_s"))
    return {"steps": len(table["new_tokens"]), "matmul_or_weights_s": matmul_s, "kv_s": kv_s,
            "floor_s": matmul_s + kv_s, "phases": {k: v for k, v in phases.items() if v["steps"]}}
