"""One quantized linear's checkpoint tensors -> graphllm's internal layout (graphllm/kernels/quant_layout.py).

W is [N, K] (nn.Linear's layout), G the group size along K. On disk, per method:

    compressed-tensors fp8   weight float8_e4m3fn [N, K], weight_scale [] / [1] (tensor) or [N] / [N, 1] (channel),
                             input_scale [] / [1] (static activations only)
    fp8 (AutoFP8)            the same, per tensor
    compressed-tensors int4  weight_packed int32 [N, K/8]: nibble j of word c is q[n, 8c + j] + 8 (q signed -8..7),
                             weight_scale [N, K/G], weight_shape [2] = (N, K), weight_zero_point int32 [N/8, K/G]
                             (asymmetric only: zero + 8 packed along N), weight_g_idx [K] (act order)
    gptq                     qweight int32 [K/8, N] (our packing), qzeros int32 [K/G, N/8] (nibble j = column 8c + j;
                             format gptq (v1) stores zero - 1), scales [K/G, N], g_idx [K]
    awq (gemm)               qweight int32 [K, N/8] and qzeros int32 [K/G, N/8], nibble i = column 8c + AWQ_ORDER[i],
                             scales [K/G, N]

and W[n, k] = (q - zero) * scale in every int4 format. Every tensor is checked for dtype and shape, every
scale for its values (finite; fp8 scales also positive); an error names it. A bias is not handled here: it is
an ordinary parameter of the model.
"""

import torch

from graphllm.kernels.quant_layout import FP8_DTYPE, INT4_PACK, check_int4_shape, pack_int4
from graphllm.models.errors import ModelLoadError
from graphllm.models.quantization.scheme import CheckpointQuantization

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INT_DTYPES = (torch.int32, torch.int64)
PER_TENSOR = ((), (1,))
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # AutoAWQ awq/utils/packing_utils.py: column 8c + AWQ_ORDER[i] sits in nibble i

LINEAR_TENSORS = {  # (method, scheme) -> the suffixes a quantized linear stores
    ("compressed-tensors", "fp8"): ("weight", "weight_scale", "input_scale"),
    ("fp8", "fp8"): ("weight", "weight_scale", "input_scale"),
    ("compressed-tensors", "int4"): ("weight_packed", "weight_scale", "weight_shape", "weight_zero_point",
                                     "weight_g_idx"),
    ("gptq", "int4"): ("qweight", "qzeros", "scales", "g_idx"),
    ("awq", "int4"): ("qweight", "qzeros", "scales"),
}


def linear_tensor_names(quant: CheckpointQuantization) -> tuple[str, ...]:
    """The tensor suffixes (after "<module path>.") a quantized linear of this checkpoint stores."""
    return LINEAR_TENSORS[(quant.method, quant.scheme)]


class StoredLinear:
    """One linear's checkpoint tensors by suffix; every read checks dtype and shape and names the tensor."""

    def __init__(self, prefix: str, tensors: dict[str, torch.Tensor]):
        self.prefix, self.tensors, self.taken = prefix, tensors, set()

    def take(self, suffix: str, dtypes: tuple[torch.dtype, ...], *shapes: tuple[int, ...],
             optional: bool = False) -> torch.Tensor | None:
        name, tensor = f"{self.prefix}.{suffix}", self.tensors.get(suffix)
        self.taken.add(suffix)
        if tensor is None:
            if optional:
                return None
            raise ModelLoadError(f"checkpoint is missing tensor {name!r}")
        if tensor.dtype not in dtypes:
            raise ModelLoadError(f"tensor {name!r} has dtype {tensor.dtype}, expected "
                                 + " or ".join(str(d) for d in dtypes))
        if tuple(tensor.shape) not in shapes:
            raise ModelLoadError(f"tensor {name!r} has shape {tuple(tensor.shape)}, expected "
                                 + " or ".join(str(s) for s in shapes))
        return tensor

    def take_scale(self, suffix: str, *shapes: tuple[int, ...], positive: bool = False) -> torch.Tensor:
        """A float scale tensor, checked as take does and for its values: finite, and > 0 where positive (the
        fp8 scales, which the libraries clamp away from 0; an int4 scale may underflow to 0 in float16)."""
        scale = self.take(suffix, FLOAT_DTYPES, *shapes)
        check_scale_values(f"{self.prefix}.{suffix}", scale, positive)
        return scale

    def check_all_taken(self, why: str) -> None:
        extra = sorted(set(self.tensors) - self.taken)
        if extra:
            name = f"{self.prefix}.{extra[0]}"
            raise ModelLoadError(f"unexpected tensor {name!r} in the checkpoint: {why}")


def check_scale_values(name: str, scale: torch.Tensor, positive: bool) -> None:
    """A NaN, infinite (or, where positive, zero or negative) scale would load and compute NaN or garbage."""
    values = scale.float().flatten()
    bad = ~torch.isfinite(values)
    if positive:
        bad |= values <= 0
    if bad.any():
        index = int(bad.nonzero()[0])
        raise ModelLoadError(f"tensor {name!r} holds {values[index].item()} at flat index {index} "
                             f"({int(bad.sum())} bad of {values.numel()}): every scale must be finite"
                             + (" and positive" if positive else ""))


def convert_linear(quant: CheckpointQuantization, prefix: str, tensors: dict[str, torch.Tensor],
                   shape: tuple[int, int], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The checkpoint tensors of the linear at `prefix` (by suffix) -> its internal layout:
    {"qweight", "weight_scale", "input_scale"?} (fp8) or {"qweight", "scales", "zeros"} (int4)."""
    stored = StoredLinear(prefix, tensors)
    converted = CONVERTERS[(quant.method, quant.scheme)](stored, *shape, quant, dtype)
    stored.check_all_taken(f"the {quant.method} {quant.scheme} layout of this linear has no such tensor")
    return converted


# --- fp8 -----------------------------------------------------------------------------------------

def fp8_linear(stored: StoredLinear, n: int, k: int, quant: CheckpointQuantization, dtype: torch.dtype):
    weight = stored.take("weight", (FP8_DTYPE,), (n, k))  # [N, K]
    shapes = PER_TENSOR if quant.weight_per_tensor else ((n,), (n, 1))
    scale = stored.take_scale("weight_scale", *shapes, positive=True)
    out = {"qweight": weight, "weight_scale": scale.float().reshape(-1).expand(n).contiguous()}  # [N]
    if not quant.input_dynamic:
        out["input_scale"] = stored.take_scale("input_scale", *PER_TENSOR, positive=True).float().reshape(1)
    return out


# --- int4 ----------------------------------------------------------------------------------------

def group_size_of(quant: CheckpointQuantization, prefix: str, n: int, k: int) -> int:
    """G for this linear (K when the checkpoint has one group per output channel); checked against the layout."""
    group = quant.group_size or k
    try:
        check_int4_shape(n, k, group)
    except ValueError as e:
        raise ModelLoadError(f"linear {prefix!r} ([N, K] = [{n}, {k}]) cannot be held in the int4 layout: {e}") from e
    if n % INT4_PACK:
        raise ModelLoadError(f"linear {prefix!r} has {n} output features, not a multiple of {INT4_PACK}")
    return group


def unpack_int4_columns(packed: torch.Tensor, order: tuple[int, ...] = tuple(range(INT4_PACK))) -> torch.Tensor:
    """int32 [R, C/8] whose nibble i of word c holds column 8c + order[i] -> int32 [R, C], values 0..15."""
    rows, words = packed.shape
    shifts = torch.arange(0, 32, 4, dtype=torch.int32)
    nibbles = (packed[:, :, None] >> shifts) & 0xF  # [R, C/8, 8], nibble i
    columns = torch.empty_like(nibbles)
    columns[:, :, list(order)] = nibbles
    return columns.reshape(rows, words * INT4_PACK)


def check_trivial_g_idx(stored: StoredLinear, suffix: str, k: int, group: int, option: str,
                        required: bool) -> None:
    """A g_idx (required where the config declares act order) is harmless only when it is the plain k // G."""
    g_idx = stored.take(suffix, INT_DTYPES, (k,), optional=not required)
    if g_idx is not None and not torch.equal(g_idx.long(), torch.arange(k) // group):
        raise ModelLoadError(f"tensor '{stored.prefix}.{suffix}' is not the trivial k // {group}: {option} "
                             "(activation order) with reordered groups is not supported")


def int4_layout(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """qweight int32 [K/8, N], scales and zeros [K/G, N] -> the int4 layout's tensors (scales, zeros in `dtype`)."""
    return {"qweight": qweight.contiguous(), "scales": scales.to(dtype).contiguous(),
            "zeros": zeros.to(dtype).contiguous()}


def ct_int4_linear(stored: StoredLinear, n: int, k: int, quant: CheckpointQuantization, dtype: torch.dtype):
    group = group_size_of(quant, stored.prefix, n, k)
    packed = stored.take("weight_packed", (torch.int32,), (n, k // INT4_PACK))  # [N, K/8]
    shape = stored.take("weight_shape", INT_DTYPES, (2,))
    if shape.tolist() != [n, k]:
        raise ModelLoadError(f"tensor '{stored.prefix}.weight_shape' is {shape.tolist()}, "
                             f"the model's linear is {[n, k]}")
    scale = stored.take_scale("weight_scale", (n, k // group))  # [N, K/G]
    if quant.symmetric:
        zeros = torch.full((k // group, n), 8)  # q + 8 against a zero point 0 + 8
    else:  # pack_to_int32(zero_point, 4, packed_dim=0): [N/8, K/G], nibble j = row 8r + j, value zero + 8
        packed_zeros = stored.take("weight_zero_point", (torch.int32,), (n // INT4_PACK, k // group))
        zeros = unpack_int4_columns(packed_zeros.t())  # [K/G, N]
    check_trivial_g_idx(stored, "weight_g_idx", k, group, "actorder", quant.act_order)
    # word c of row n holds q[n, 8c + j] + 8 in nibble j: transposed, that is the internal packing
    return int4_layout(packed.t(), scale.t(), zeros, dtype)


def gptq_linear(stored: StoredLinear, n: int, k: int, quant: CheckpointQuantization, dtype: torch.dtype):
    group = group_size_of(quant, stored.prefix, n, k)
    qweight = stored.take("qweight", (torch.int32,), (k // INT4_PACK, n))  # [K/8, N], already our packing
    qzeros = stored.take("qzeros", (torch.int32,), (k // group, n // INT4_PACK))
    scales = stored.take_scale("scales", (k // group, n))
    check_trivial_g_idx(stored, "g_idx", k, group, "desc_act", quant.act_order)
    zeros = unpack_int4_columns(qzeros) + (1 if quant.format == "gptq" else 0)  # v1 stores zero - 1
    if int(zeros.max()) > 15:
        raise ModelLoadError(f"tensor '{stored.prefix}.qzeros' holds a nibble 15 in the v1 format (zero point 16): "
                             "GPTQ v1 cannot store a zero point 0 (zero - 1 overflows into the next nibble); "
                             "this checkpoint needs checkpoint_format gptq_v2")
    return int4_layout(qweight, scales, zeros, dtype)


def awq_linear(stored: StoredLinear, n: int, k: int, quant: CheckpointQuantization, dtype: torch.dtype):
    group = group_size_of(quant, stored.prefix, n, k)
    qweight = stored.take("qweight", (torch.int32,), (k, n // INT4_PACK))  # [K, N/8]
    qzeros = stored.take("qzeros", (torch.int32,), (k // group, n // INT4_PACK))
    scales = stored.take_scale("scales", (k // group, n))
    q = unpack_int4_columns(qweight, AWQ_ORDER)  # [K, N]
    return int4_layout(pack_int4(q), scales, unpack_int4_columns(qzeros, AWQ_ORDER), dtype)


CONVERTERS = {
    ("compressed-tensors", "fp8"): fp8_linear,
    ("fp8", "fp8"): fp8_linear,
    ("compressed-tensors", "int4"): ct_int4_linear,
    ("gptq", "int4"): gptq_linear,
    ("awq", "int4"): awq_linear,
}
