"""The mechanism behind quantize_fp8, quantize_int8 and quantize_int4: swap a linear node for a
quantized-linear op whose weights replace the old one in the graph's weight dict.

A linear is `aten.linear.default(x, <p>.weight[, bias])` with `<p>.weight` a get_attr node of a 2-D
floating weight. Each pass hands a `Scheme`: the op and how to make its weight tensors, and the
module path `<p>` gets them as parameters `<p>.<tensor name>`:

    before                                              after (int4, say)
    w = get_attr <p>.weight                             qw = get_attr <p>.qweight   # int32 [K/8, N]
    y = aten.linear.default(x, w, b)                    s  = get_attr <p>.scales    # [K/G, N]
                                                        z  = get_attr <p>.zeros     # [K/G, N]
                                                        y  = graphllm.int4_linear.default(x, qw, s, z, b)

Which linears: with no checkpoint, every one except lm_head (unless `include_lm_head`) and an MoE router
(a linear named `gate`: tiny, and its softmax picks the experts; vLLM keeps it unquantized too); a layer the
scheme cannot hold (`Scheme.cannot_hold` says why) stays as it is, with a log line. With a
pre-quantized checkpoint (the tensors graphllm/models/loader.load_checkpoint unpacked into the same
layout), exactly the linears it has, and a checkpoint linear the graph does not have is an error.
The old weights are dropped when nothing else reads them (a tied embedding still does).
"""

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import fx

import graphllm.ops.quantized_linear  # noqa: F401  (registers the quantized-linear ops)
from graphllm.ir.graph import StepGraph, attr_tensor, copy_source_meta
from graphllm.passes.base import source_uuid

LINEAR = torch.ops.aten.linear.default
STEP_PREFIX = "model."  # the capture's StepModule holds the model as `model`
ROUTER = "gate"  # an MoE block's router linear (graphllm/models/moe.py); dense MLPs name theirs gate_proj
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Scheme:
    name: str                                    # "fp8", "int8", "int4"
    op: object                                   # the quantized-linear op overload
    tensor_names: tuple[str, ...]                # its weight operands in argument order (None allowed)
    quantize: Callable[[torch.Tensor], dict]     # float W [N, K] -> {tensor name: tensor}
    cannot_hold: Callable[[torch.Tensor], str | None] = lambda w: None  # why W stays unquantized


def quantize_linears(graph: StepGraph, scheme: Scheme, include_lm_head: bool,
                     checkpoint: Mapping[str, Mapping[str, torch.Tensor]] | None) -> dict[str, int]:
    """Rewrite the chosen linears; counts {"quantized": n, "kept": layers left unquantized}."""
    counts = {"quantized": 0, "kept": 0}
    found = set()
    for node in list(graph.graph.nodes):
        prefix = _linear_prefix(node)
        if prefix is None:
            continue
        name = prefix.removeprefix(STEP_PREFIX)
        if checkpoint is not None:
            if name not in checkpoint:
                continue
            found.add(name)
            tensors = dict(checkpoint[name])
        else:
            last = name.rpartition(".")[2]
            if last == "lm_head" and not include_lm_head or last == ROUTER:
                continue
            weight = attr_tensor(graph.gm, node.args[1])
            why = scheme.cannot_hold(weight)
            if why:
                log.info("%s stays %s: %s", name, str(weight.dtype).removeprefix("torch."), why)
                counts["kept"] += 1
                continue
            tensors = scheme.quantize(weight)
        _replace(graph, node, prefix, scheme, tensors)
        counts["quantized"] += 1
    if checkpoint is not None and set(checkpoint) - found:
        missing = sorted(set(checkpoint) - found)
        raise ValueError(f"the checkpoint has {scheme.name} weights for linear(s) the model graph does not "
                         f"have: {', '.join(missing[:5])}")
    if counts["quantized"]:
        graph.drop_unused_weights()
    return counts


def mechanism_uuid(pass_uuid: str) -> str:
    """A pass's uuid mixed with this module's source (editing the mechanism invalidates artifacts)."""
    return source_uuid(__name__, pass_uuid)


def _linear_prefix(node: fx.Node) -> str | None:
    """`<p>` for node = aten.linear(x, get_attr <p>.weight[, bias]) over a 2-D floating weight."""
    if node.op != "call_function" or node.target is not LINEAR or len(node.args) < 2:
        return None
    weight = node.args[1]
    if not isinstance(weight, fx.Node) or weight.op != "get_attr" or not weight.target.endswith(".weight"):
        return None
    return weight.target.removesuffix(".weight")


def _replace(graph: StepGraph, node: fx.Node, prefix: str, scheme: Scheme, tensors: dict) -> None:
    x = node.args[0]
    bias = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
    if bias is None and tensors.get("bias") is not None:  # a checkpoint's bias, beside its packed weight
        bias = graph.add_weight(f"{prefix}.bias", tensors["bias"], like=node)
    operands = [None if tensors.get(t) is None else graph.add_weight(f"{prefix}.{t}", tensors[t], like=node)
                for t in scheme.tensor_names]
    with graph.graph.inserting_before(node):
        new = graph.graph.call_function(scheme.op, (x, *operands, bias))
    copy_source_meta(new, node)
    if "val" in node.meta:  # same shape, dtype and device as the linear it replaces
        new.meta["val"] = node.meta["val"]
    node.replace_all_uses_with(new)
    graph.graph.erase_node(node)
