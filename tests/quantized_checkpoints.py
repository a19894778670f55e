"""Tiny pre-quantized Hugging Face folders, written in each library's exact on-disk layout (no downloads).

Each writer starts from a tiny model of tests/tiny_models.py, quantizes every linear of the decoder
layers (lm_head stays float; in a mixture of experts, each expert's linears and the router, as
llm-compressor sees them: `experts.{e}.gate_proj` ..., `mlp.gate`, unless the ignore list names them)
with that library's own quantizer and packing, ported below line for
line from the file cited, and rewrites model.safetensors and config.json. Each format also has the
library's own dequantization, also ported, which `write_dequantized_folder` uses to write a plain
float32 folder that transformers loads: the oracle for the same weights.

The compressed-tensors ports are checked against the installed package where it is present
(tests/models/test_quantized_checkpoint.py::test_ct_*_matches_the_library).
"""

import json
import re
import shutil
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import load_file, save_file

from tests.tiny_models import make_hf_model, save_model_folder

LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
# MoE linears as published: one per expert and projection (Mixtral w1/w3/w2, Qwen3-MoE gate/up/down_proj), the router
MOE_LINEARS = re.compile(r".*\.(experts\.\d+\.(w1|w2|w3|gate_proj|up_proj|down_proj)|block_sparse_moe\.gate|mlp\.gate)")
ROUTERS = r"re:.*(block_sparse_moe|mlp)\.gate$"  # the ignore entry that keeps every router float (as published)
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # AutoAWQ awq/utils/packing_utils.py
AWQ_REVERSE_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]


def as_int32(words: torch.Tensor) -> torch.Tensor:
    """uint32 values held in int64 -> int32 with the same bits (numpy's astype(np.int32))."""
    words = words & 0xFFFFFFFF
    return (words - (words >= 2**31).long() * 2**32).to(torch.int32)


# --- GPTQ: AutoGPTQ auto_gptq/quantization/quantizer.py (Quantizer.find_params, quantize) and
#     auto_gptq/nn_modules/qlinear/qlinear_cuda_old.py (QuantLinear.pack, bits 4), qlinear_cuda.py (forward) ----

def gptq_find_params(x: torch.Tensor, sym: bool, maxq: int = 15) -> tuple[torch.Tensor, torch.Tensor]:
    """x [N, G] -> scale, zero [N] (per row of the group)."""
    xmin = torch.minimum(x.min(1).values, torch.zeros(x.shape[0]))
    xmax = torch.maximum(x.max(1).values, torch.zeros(x.shape[0]))
    if sym:
        xmax = torch.maximum(torch.abs(xmin), xmax)
        xmin[xmin < 0] = -xmax[xmin < 0]
    both_zero = (xmin == 0) & (xmax == 0)
    xmin[both_zero], xmax[both_zero] = -1, +1
    scale = (xmax - xmin) / maxq
    zero = torch.full_like(scale, (maxq + 1) / 2) if sym else torch.round(-xmin / scale)
    return scale, zero


def gptq_quantize(w: torch.Tensor, group_size: int, sym: bool, perm: torch.Tensor | None):
    """GPTQ's grouping without its error feedback (same layout): W [N, K] -> (Q = dequantized W [N, K],
    scales [N, K/G], zeros [N, K/G], g_idx [K]). With perm (desc_act), groups follow the permuted columns."""
    n, k = w.shape
    perm = torch.arange(k) if perm is None else perm
    wp, scales, zeros, q = w[:, perm], [], [], torch.empty_like(w)
    for i in range(k):
        if i % group_size == 0:
            scale, zero = gptq_find_params(wp[:, i:i + group_size], sym)
            scales.append(scale)
            zeros.append(zero)
        q[:, i] = scale * (torch.clamp(torch.round(wp[:, i] / scale) + zero, 0, 15) - zero)
    invperm = torch.argsort(perm)
    g_idx = (torch.arange(k) // group_size)[invperm].to(torch.int32)
    return q[:, invperm], torch.stack(scales, 1), torch.stack(zeros, 1), g_idx


def gptq_pack(w: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, g_idx: torch.Tensor, v1: bool = True):
    """QuantLinear.pack: W [N, K], scales/zeros [N, K/G] -> qweight [K/8, N], qzeros [K/G, N/8], scales fp16."""
    scales, zeros = scales.t().contiguous(), zeros.t().contiguous()
    scale_zeros = zeros * scales
    half = scales.clone().half()
    intweight = torch.cat([torch.round((w[:, idx] + scale_zeros[g_idx[idx]]) / half[g_idx[idx]]).to(torch.int)[:, None]
                           for idx in range(w.shape[1])], dim=1).t().contiguous().long() & 0xFFFFFFFF  # [K, N]
    qweight = torch.zeros(intweight.shape[0] // 8, intweight.shape[1], dtype=torch.int64)
    for row in range(qweight.shape[0]):
        for j in range(8):
            qweight[row] |= (intweight[8 * row + j] << (4 * j)) & 0xFFFFFFFF
    zeros = (zeros.long() - (1 if v1 else 0)) & 0xFFFFFFFF  # v1: zeros -= 1, then astype(np.uint32)
    qzeros = torch.zeros(zeros.shape[0], zeros.shape[1] // 8, dtype=torch.int64)
    for col in range(qzeros.shape[1]):
        for j in range(8):
            qzeros[:, col] |= (zeros[:, 8 * col + j] << (4 * j)) & 0xFFFFFFFF
    return as_int32(qweight), as_int32(qzeros), half


def gptq_dequantize(qweight, qzeros, scales, g_idx, v1: bool = True) -> torch.Tensor:
    """QuantLinear.forward's torch path (bits 4), in float32: -> W [N, K]."""
    wf = torch.arange(0, 32, 4, dtype=torch.int32)[None, :]
    zeros = torch.bitwise_right_shift(qzeros[:, :, None].expand(-1, -1, 8), wf[None]).to(torch.int8)
    zeros = torch.bitwise_and(zeros, 15).long() + (1 if v1 else 0)
    zeros = zeros.reshape(scales.shape)
    weight = torch.bitwise_right_shift(qweight[:, None, :].expand(-1, 8, -1), wf[:, :, None]).to(torch.int8)
    weight = torch.bitwise_and(weight, 15).reshape(-1, qweight.shape[1])
    g = g_idx.long()
    return (scales.float()[g] * (weight - zeros[g])).t()


# --- AWQ: AutoAWQ awq/quantize/quantizer.py (pseudo_quantize_tensor, zero_point), awq/modules/linear/gemm.py
#     (WQLinear_GEMM.from_linear), awq/utils/packing_utils.py (dequantize_gemm) ---------------------------------

def awq_pseudo_quantize(w: torch.Tensor, group_size: int):
    """W [N, K] (fp16, as _apply_quant casts it) -> (dequantized W, scales [N, K/G], zeros [N, K/G])."""
    shape = w.shape
    w = w.reshape(-1, group_size)
    max_val, min_val = w.amax(dim=1, keepdim=True), w.amin(dim=1, keepdim=True)
    scales = (max_val - min_val).clamp(min=1e-5) / 15
    zeros = (-torch.round(min_val / scales)).clamp_(0, 15)
    w = (torch.clamp(torch.round(w / scales) + zeros, 0, 15) - zeros) * scales
    return w.reshape(shape), scales.view(shape[0], -1), zeros.view(shape[0], -1)


def awq_pack(w: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int):
    """from_linear with scales/zeros [K/G, N] (transposed by _apply_quant for gemm) -> qweight [K, N/8],
    qzeros [K/G, N/8], scales fp16."""
    scale_zeros = zeros * scales
    half = scales.clone().half()
    intweight = torch.cat([torch.round((w[:, idx] + scale_zeros[idx // group_size]) / half[idx // group_size])
                           .to(torch.int)[:, None] for idx in range(w.shape[1])], dim=1)
    intweight = intweight.t().contiguous().to(torch.int32)
    assert 0 <= int(intweight.min()) and int(intweight.max()) <= 15, "fixture: AWQ int weight out of range"
    return awq_pack_columns(intweight), awq_pack_columns(zeros.to(torch.int32)), half


def awq_pack_columns(values: torch.Tensor) -> torch.Tensor:
    packed = torch.zeros(values.shape[0], values.shape[1] // 8, dtype=torch.int32)
    for col in range(values.shape[1] // 8):
        for i in range(8):
            packed[:, col] |= values[:, col * 8 + AWQ_ORDER[i]] << (i * 4)
    return packed


def awq_dequantize(qweight, qzeros, scales, group_size: int) -> torch.Tensor:
    """dequantize_gemm, in float32: -> W [N, K]."""
    shifts = torch.arange(0, 32, 4)
    iweights = torch.bitwise_right_shift(qweight[:, :, None], shifts[None, None, :]).to(torch.int8)
    izeros = torch.bitwise_right_shift(qzeros[:, :, None], shifts[None, None, :]).to(torch.int8)
    iweights, izeros = iweights.view(iweights.shape[0], -1), izeros.view(izeros.shape[0], -1)
    order = torch.arange(izeros.shape[-1]).view(-1, 8)[:, AWQ_REVERSE_ORDER].view(-1)
    iweights, izeros = torch.bitwise_and(iweights[:, order], 15), torch.bitwise_and(izeros[:, order], 15)
    s = scales.float().repeat_interleave(group_size, dim=0)
    return ((iweights - izeros.repeat_interleave(group_size, dim=0)) * s).t()


# --- compressed-tensors: compressors/pack_quantized/helpers.py (pack_to_int32, unpack_from_int32),
#     quantization/utils/helpers.py (calculate_qparams), quantization/lifecycle/forward_helpers.py ------------

def ct_pack_to_int32(value: torch.Tensor, num_bits: int = 4, packed_dim: int = 1) -> torch.Tensor:
    """pack_to_int32: int8 [R, C] (signed) -> int32 [R, ceil(C * bits / 32)], value + 2^(bits-1), dense."""
    assert value.dtype is torch.int8
    value = value.to(torch.int32) + (1 << (num_bits - 1))
    if packed_dim == 0:
        value = value.transpose(0, 1)
    rows, cols = value.shape
    padded = -(-cols // 32) * 32
    value_g = torch.nn.functional.pad(value, (0, padded - cols)).reshape(rows * padded // 32, 32)
    bit_starts = torch.arange(32, dtype=torch.int32) * num_bits
    word_idx, bit_offset = (bit_starts // 32).long(), bit_starts % 32
    out = torch.zeros(value_g.shape[0], num_bits, dtype=torch.int32)
    out.scatter_add_(1, word_idx[None].expand(value_g.shape[0], -1), value_g << bit_offset[None])
    out = out.view(rows, padded // 32 * num_bits)[:, :-(-cols * num_bits // 32)]
    return (out.transpose(0, 1) if packed_dim == 0 else out).contiguous()


def ct_unpack_from_int32(value: torch.Tensor, shape: tuple[int, int], packed_dim: int = 1) -> torch.Tensor:
    """unpack_from_int32 (num_bits 4): -> int8 [shape], signed."""
    if packed_dim == 0:
        value = value.transpose(0, 1)
    rows, cols = value.shape[0], shape[packed_dim]
    nibbles = value.contiguous().view(torch.uint8)  # little-endian host
    out = torch.stack((nibbles & 0xF, nibbles >> 4), dim=-1).view(torch.int8).view(rows, -1)[:, :cols] - 8
    return out.transpose(0, 1) if packed_dim == 0 else out


def ct_int4_qparams(w: torch.Tensor, group_size: int, sym: bool):
    """calculate_qparams for int4 over groups of W [N, K] -> scale [N, K/G] (w's dtype), zero point int8 [N, K/G]."""
    groups = w.reshape(w.shape[0], -1, group_size)
    lo, hi = groups.amin(-1).clamp(max=0), groups.amax(-1).clamp(min=0)
    if sym:
        scale, zp = torch.maximum(lo.abs(), hi) / (15 / 2), torch.zeros_like(lo)
    else:
        scale = (hi - lo) / 15
        zp = torch.clamp(-8 - lo / scale, -8, 7)
    scale = torch.where(scale == 0, torch.finfo(scale.dtype).eps, scale)
    return scale, torch.round(zp).to(torch.int8)


def ct_int4_quantize(w, scale, zp, group_size):
    """quantize(..., dtype=int8) for strategy group: round(w / scale + zp) clamped to -8..7 -> int8 [N, K]."""
    x = w.reshape(w.shape[0], -1, group_size) / scale[..., None] + zp[..., None].to(w.dtype)
    return torch.round(torch.clamp(x, -8, 7)).to(torch.int8).reshape(w.shape)


def ct_int4_dequantize(packed, scale, zp_packed, shape) -> torch.Tensor:
    """PackedQuantizationCompressor.decompress (unpack, then dequantize: (q - zp) * scale), in float32 -> W [N, K]."""
    n, k = shape
    groups = scale.shape[1]
    q = ct_unpack_from_int32(packed, (n, k)).float().reshape(n, groups, k // groups)
    zp = 0.0 if zp_packed is None else ct_unpack_from_int32(zp_packed, (n, groups), packed_dim=0).float()[..., None]
    return ((q - zp) * scale.float()[..., None]).reshape(n, k)


def ct_fp8_quantize(w: torch.Tensor, per_tensor: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """min-max fp8 scale (absmax / 448; [N, 1] per channel, [1] per tensor) and the float8 weight."""
    absmax = w.abs().amax() if per_tensor else w.abs().amax(dim=1, keepdim=True)
    scale = (absmax / FP8_MAX).reshape(1) if per_tensor else absmax / FP8_MAX
    return torch.clamp(w / scale, -FP8_MAX, FP8_MAX).to(FP8), scale


def ct_ignored(prefix: str, ignore: tuple[str, ...]) -> bool:
    """compressed-tensors' match_name (compressed_tensors/utils/match.py): "re:" + re.match, else exact."""
    return any(re.match(t[3:], prefix) if t.startswith("re:") else t == prefix for t in ignore)


# --- folders -------------------------------------------------------------------------------------

LinearQuantizer = Callable[[str, torch.Tensor, torch.Tensor | None], dict[str, torch.Tensor]]


def quantize_folder(path: Path, arch: str, quantization_config: dict, quantize_linear: LinearQuantizer,
                    skip: Callable[[str], bool] = lambda prefix: False) -> Path:
    """A tiny model of `arch` saved to path, its decoder linears replaced by quantize_linear(prefix, W, bias)."""
    folder = save_model_folder(make_hf_model(arch), Path(path))
    tensors = load_file(folder / "model.safetensors")
    prefixes = sorted({prefix for prefix in (name.rsplit(".", 1)[0] for name in tensors)
                       if prefix.endswith(LINEARS) or MOE_LINEARS.fullmatch(prefix)})
    for prefix in (p for p in prefixes if not skip(p)):
        weight, bias = tensors.pop(f"{prefix}.weight"), tensors.pop(f"{prefix}.bias", None)
        tensors.update({f"{prefix}.{key}": t for key, t in quantize_linear(prefix, weight, bias).items()})
    save_file(tensors, folder / "model.safetensors")
    edit_config(folder, lambda c: c.update(quantization_config=quantization_config))
    return folder


def edit_config(folder: Path, edit: Callable[[dict], None]) -> None:
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config, indent=2))


def with_bias(out: dict, bias: torch.Tensor | None, dtype: torch.dtype | None = None) -> dict:
    return out if bias is None else {**out, "bias": bias if dtype is None else bias.to(dtype)}


def write_gptq_folder(path, arch: str = "llama", sym: bool = True, group_size: int = 32, desc_act: bool = False,
                      static_groups: bool = False, checkpoint_format: str = "gptq") -> Path:
    """AutoGPTQ's layout; desc_act without static_groups stores a reordered (non-trivial) g_idx."""
    def quantize(prefix, w, bias):
        k = w.shape[1]
        perm = torch.randperm(k, generator=torch.Generator().manual_seed(k)) if desc_act and not static_groups else None
        q, scales, zeros, g_idx = gptq_quantize(w, group_size if group_size > 0 else k, sym, perm)
        qweight, qzeros, half = gptq_pack(q, scales, zeros, g_idx, v1=checkpoint_format == "gptq")
        return with_bias({"qweight": qweight, "qzeros": qzeros, "scales": half, "g_idx": g_idx}, bias, torch.float16)
    config = {"quant_method": "gptq", "bits": 4, "group_size": group_size, "desc_act": desc_act, "sym": sym,
              "static_groups": static_groups, "true_sequential": True, "damp_percent": 0.01,
              "checkpoint_format": checkpoint_format, "model_name_or_path": None, "model_file_base_name": "model"}
    return quantize_folder(path, arch, config, quantize)


def write_awq_folder(path, arch: str = "llama", group_size: int = 32, version: str = "gemm",
                     modules_to_not_convert: list[str] | None = None) -> Path:
    """AutoAWQ's GEMM layout (transformers' AwqConfig keys in config.json)."""
    def quantize(prefix, w, bias):
        g = group_size if group_size > 0 else w.shape[1]
        wq, scales, zeros = awq_pseudo_quantize(w.half(), g)
        qweight, qzeros, half = awq_pack(wq, scales.t().contiguous(), zeros.t().contiguous(), g)
        return with_bias({"qweight": qweight, "qzeros": qzeros, "scales": half}, bias, torch.float16)
    config = {"quant_method": "awq", "bits": 4, "group_size": group_size, "zero_point": True, "version": version,
              "modules_to_not_convert": modules_to_not_convert}
    skip = lambda prefix: any(m in prefix for m in modules_to_not_convert or ())  # noqa: E731
    return quantize_folder(path, arch, config, quantize, skip)


def ct_config(weights: dict, input_activations: dict | None, fmt: str, ignore: list[str], kv: dict | None) -> dict:
    """compressed-tensors' quantization_config as ModelCompressor.update_config writes it (one scheme)."""
    def args(**given):
        return {"num_bits": 8, "type": "float", "symmetric": True, "group_size": None, "strategy": None,
                "block_structure": None, "dynamic": False, "actorder": None, "observer": None, "observer_kwargs": {},
                **given}
    return {"quant_method": "compressed-tensors", "format": fmt, "quantization_status": "compressed",
            "version": "0.20.0", "sparsity_config": {}, "transform_config": {}, "global_compression_ratio": None,
            "ignore": ignore, "kv_cache_scheme": None if kv is None else args(**kv),
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": args(**weights), "format": fmt,
                                          "input_activations": input_activations and args(**input_activations),
                                          "output_activations": None}}}


def write_ct_fp8_folder(path, arch: str = "llama", weight_strategy: str = "channel", dynamic: bool = True,
                        kv_scales: bool = False, ignore: tuple[str, ...] = ("lm_head",)) -> Path:
    """llm-compressor's FP8 (W8A8) layout: float-quantized, static or dynamic activations, optional fp8 KV scales."""
    kv_extra: dict[str, torch.Tensor] = {}  # self_attn.k_scale / v_scale: beside the projections, not on them

    def quantize(prefix, w, bias):
        weight, scale = ct_fp8_quantize(w, weight_strategy == "tensor")
        out = {"weight": weight, "weight_scale": scale}
        if not dynamic:
            # one scale per input tensor, as calibration gives: q/k/v read one input, gate/up another
            reads = {"k_proj": "q_proj", "v_proj": "q_proj", "up_proj": "gate_proj"}
            parent, _, proj = prefix.rpartition(".")
            out["input_scale"] = torch.tensor([0.02 + 0.001 * len(f"{parent}.{reads.get(proj, proj)}")])
        attention, _, proj = prefix.rpartition(".")
        if kv_scales and proj in ("k_proj", "v_proj"):
            layer = int(attention.split(".")[2])  # model.layers.<i>.self_attn: k 0.5, 0.75, ..., v half of k
            kv_extra[f"{attention}.{proj[0]}_scale"] = torch.tensor([(0.5 + 0.25 * layer) / (1 if proj == "k_proj" else 2)])
        return with_bias(out, bias)
    acts = dict(strategy="token", dynamic=True) if dynamic else dict(strategy="tensor", dynamic=False)
    kv = dict(strategy="tensor") if kv_scales else None
    config = ct_config(dict(strategy=weight_strategy), acts, "float-quantized", list(ignore), kv)
    folder = quantize_folder(path, arch, config, quantize, lambda prefix: ct_ignored(prefix, ignore))
    if kv_extra:
        save_file({**load_file(folder / "model.safetensors"), **kv_extra}, folder / "model.safetensors")
    return folder


def write_ct_w4a16_folder(path, arch: str = "llama", group_size: int = 32, sym: bool = True,
                          ignore: tuple[str, ...] = ("lm_head",)) -> Path:
    """llm-compressor's W4A16 layout: pack-quantized int4, group (or channel, group_size=None), sym or asym."""
    def quantize(prefix, w, bias):
        g = group_size or w.shape[1]
        scale, zp = ct_int4_qparams(w, g, sym)
        out = {"weight_packed": ct_pack_to_int32(ct_int4_quantize(w, scale, zp, g)), "weight_scale": scale,
               "weight_shape": torch.tensor(w.shape)}
        if not sym:
            out["weight_zero_point"] = ct_pack_to_int32(zp, packed_dim=0)
        return with_bias(out, bias)
    weights = dict(num_bits=4, type="int", symmetric=sym, strategy="group" if group_size else "channel",
                   group_size=group_size, observer="minmax")
    config = ct_config(weights, None, "pack-quantized", list(ignore), None)
    return quantize_folder(path, arch, config, quantize, lambda prefix: ct_ignored(prefix, ignore))


# --- the oracle: the library-side dequantization, as a plain float32 folder ------------------------

def dequantize_linear(method: str, config: dict, stored: dict[str, torch.Tensor]) -> torch.Tensor:
    """One linear's stored tensors (by suffix) -> float32 W [N, K], the way its library dequantizes it."""
    if method == "gptq":
        k = stored["qweight"].shape[0] * 8
        g_idx = stored.get("g_idx", torch.arange(k) // (k // stored["scales"].shape[0]))
        return gptq_dequantize(stored["qweight"], stored["qzeros"], stored["scales"], g_idx,
                               v1=config.get("checkpoint_format", "gptq") == "gptq")
    if method == "awq":
        k = stored["qweight"].shape[0]
        return awq_dequantize(stored["qweight"], stored["qzeros"], stored["scales"], k // stored["scales"].shape[0])
    if "weight_packed" in stored:
        return ct_int4_dequantize(stored["weight_packed"], stored["weight_scale"], stored.get("weight_zero_point"),
                                  tuple(stored["weight_shape"].tolist()))
    scale = stored["weight_scale"].float()  # fp8: [1] / [] per tensor, [N, 1] per channel
    return stored["weight"].float() * (scale.reshape(-1, 1) if scale.numel() > 1 else scale.reshape(()))


QUANTIZED_SUFFIXES = ("qweight", "qzeros", "scales", "g_idx", "weight_packed", "weight_scale", "weight_shape",
                      "weight_zero_point", "input_scale")
KV_SUFFIXES = ("k_scale", "v_scale", "output_scale")


def write_dequantized_folder(quantized_folder, out) -> Path:
    """A plain float32 folder with the library-dequantized weights of `quantized_folder` (KV scales dropped)."""
    src, out = Path(quantized_folder), Path(out)
    shutil.copytree(src, out)
    config = json.loads((src / "config.json").read_text())
    quantization = config.pop("quantization_config")
    tensors = load_file(src / "model.safetensors")
    linears: dict[str, dict[str, torch.Tensor]] = {}
    plain: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        prefix, _, suffix = name.rpartition(".")
        fp8_weight = suffix == "weight" and f"{prefix}.weight_scale" in tensors
        if suffix in QUANTIZED_SUFFIXES or fp8_weight:
            linears.setdefault(prefix, {})[suffix] = tensor
        elif suffix not in KV_SUFFIXES:
            plain[name] = tensor
    plain.update({f"{p}.weight": dequantize_linear(quantization["quant_method"], quantization, stored)
                  for p, stored in linears.items()})
    save_file({name: t.float().contiguous() for name, t in plain.items()}, out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out
