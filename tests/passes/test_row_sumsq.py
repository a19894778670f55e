"""RowSumsq: the product before an add_rms_norm_linear stores the norm's row statistics; same logits and KV writes."""

import pytest
import torch

from graphllm.config import CompileConfig
from graphllm.ops.linear import (add_rms_norm_linear, add_rms_norm_linear_sumsq, gelu_tanh_and_mul_linear,
                                 linear_row_sumsq, silu_and_mul_linear)
from graphllm.passes.lowering.linear_epilogue import LinearEpilogue
from graphllm.passes.lowering.linear_prologue import LinearPrologue
from graphllm.passes.lowering.row_sumsq import RowSumsq, row_mask
from graphllm.passes.manager import PassManager
from graphllm.passes.utility.dce import DeadCodeElimination
from tests.passes.harness import assert_same_function, copy_graph
from tests.passes.test_linear_prologue import prepared, targets

ops = torch.ops.graphllm


def rewritten(arch: str, epilogue: bool = False):
    before, config = prepared(arch)
    LinearPrologue()(before)
    if epilogue:
        LinearEpilogue()(before)
    after = copy_graph(before)
    counts = RowSumsq()(after)
    DeadCodeElimination()(after)
    return before, after, counts, config


def test_tiny_llama_pairs_every_norm_after_a_product():
    """The tiny Llama's o_proj [64, 64] and gate_up [256, 64] both run the kernel at 1-8 rows; its down [64, 128]
    runs it at one row only (qkv [128, 64] at 2-8 rows and down there: cuBLAS), so down pairs with the next qkv
    for one row. The same function, exactly (CPU: the ops' parts)."""
    before, after, counts, config = rewritten("llama")
    layers = config.num_hidden_layers
    assert counts == {"none": layers, "silu": layers - 1, "gelu": 0, "int4": 0}
    found = targets(after)
    assert found.count(ops.linear_row_sumsq.default) == 2 * layers - 1
    assert ops.add_rms_norm_linear.default not in found
    masks = {n.args[5]: n.args[4] for n in after.graph.nodes if n.target == ops.linear_row_sumsq.default}
    assert masks == {0: sum(1 << m for m in range(1, 9)), 1: 1 << 1}
    assert_same_function(before, after, config, seeds=(1, 2), atol=0.0)


@pytest.mark.parametrize("arch", ("llama", "qwen2"))  # qwen2: the qkv bias goes along
def test_every_pair_when_every_shape_takes_the_kernel(arch, monkeypatch):
    """With the rule saying yes to every shape, down_proj (SwiGLU in its prologue) pairs with the next layer's qkv
    too, and no add_rms_norm_linear is left; the last layer's down stays (the final norm is a plain add_rms_norm
    before the row gather)."""
    monkeypatch.setattr("graphllm.kernels.skinny_matmul.takes_row_sumsq", lambda m, before, after: 1 <= m <= 8)
    before, after, counts, config = rewritten(arch)
    layers = config.num_hidden_layers
    assert counts == {"none": layers, "silu": layers - 1, "gelu": 0, "int4": 0}
    found = targets(after)
    assert ops.add_rms_norm_linear.default not in found and ops.silu_and_mul_linear.default in found  # the last down
    acts = sorted(n.args[5] for n in after.graph.nodes if n.target == ops.linear_row_sumsq.default)
    assert acts == [0] * layers + [1] * (layers - 1)
    assert_same_function(before, after, config, seeds=(1, 2), atol=0.0)


def test_with_the_epilogue_pass_only_down_pairs(monkeypatch):
    """linear_epilogue takes gate_up's norm into add_rms_norm_linear_act_and_mul: that pair stays; down (a plain
    linear now) still pairs with the next qkv."""
    monkeypatch.setattr("graphllm.kernels.skinny_matmul.takes_row_sumsq", lambda m, before, after: 1 <= m <= 8)
    before, after, counts, config = rewritten("llama", epilogue=True)
    assert counts == {"none": config.num_hidden_layers - 1, "silu": 0, "gelu": 0, "int4": 0}
    assert_same_function(before, after, config, seeds=(1,), atol=0.0)


def test_gemma_post_norms_leave_nothing_to_pair():
    """Gemma 2 normalises attention's output before the add (its post-norm): o_proj does not feed the
    add_rms_norm_linear, so nothing is rewritten."""
    _, _, counts, _ = rewritten("gemma2")
    assert counts == {"none": 0, "silu": 0, "gelu": 0, "int4": 0}


def test_row_mask():
    full = sum(1 << m for m in range(1, 9))
    assert row_mask((4096, 4096), (28672, 4096)) == full  # Llama-3-8B o_proj -> gate_up
    assert row_mask((4096, 14336), (6144, 4096)) == 2 | 4 | 16 | 256  # down -> qkv: one row and CONFIGS' buckets
    assert row_mask((3072, 8192), (9216, 3072)) == 2  # Phi-3-mini's down and qkv at 2-8 rows: cuBLAS
    assert row_mask(None, (28672, 4096)) == 0 and row_mask((4096, 4096), (28672, 2048)) == 0
    assert row_mask((14336, 4096), (4096, 14336)) == 0  # a product on cuBLAS at every row count


def test_ops_equal_their_parts_off_the_kernel_path():
    """CPU (and rows outside the mask on CUDA): the product is the op it stands for, exactly, and the norm op is
    add_rms_norm_linear, whatever sumsq holds."""
    gen = torch.Generator().manual_seed(0)
    x, r = torch.randn(5, 3, 32, generator=gen), torch.randn(5, 3, 48, generator=gen)
    w, b = torch.randn(48, 32, generator=gen), torch.randn(48, generator=gen)
    full = sum(1 << m for m in range(1, 9))
    y, sumsq = linear_row_sumsq(x, w, b, r, full, 0)
    assert torch.equal(y, torch.nn.functional.linear(x, w, b)) and sumsq.shape == (5, 3, 3)
    wide = torch.randn(5, 3, 64, generator=gen)
    assert torch.equal(linear_row_sumsq(wide, w, None, r, full, 1)[0], silu_and_mul_linear(wide, w))
    assert torch.equal(linear_row_sumsq(wide, w, None, r, full, 2)[0], gelu_tanh_and_mul_linear(wide, w))
    nw, w2 = torch.randn(48, generator=gen), torch.randn(16, 48, generator=gen)
    out, h = add_rms_norm_linear_sumsq(y, r, torch.full_like(sumsq, float("nan")), nw, 1e-5, w2, None, True, full)
    want, want_h = add_rms_norm_linear(y, r, nw, 1e-5, w2, None, True)
    assert torch.equal(out, want) and torch.equal(h, want_h)


def test_the_switch_is_in_the_pass_list_and_its_uuid():
    on, off = PassManager(CompileConfig(row_sumsq=True)), PassManager(CompileConfig())
    names = [p.name for p in on.passes]
    assert "row_sumsq" in names and "row_sumsq" not in [p.name for p in off.passes]
    assert names.index("linear_prologue") < names.index("row_sumsq")
    both = [p.name for p in PassManager(CompileConfig(row_sumsq=True, linear_epilogue=True)).passes]
    assert both.index("linear_epilogue") < both.index("row_sumsq")
    assert on.uuid() != off.uuid()
    assert "row_sumsq" not in [p.name for p in PassManager(CompileConfig(row_sumsq=True, linear_prologue=False)).passes]


def test_the_default_runs_both_folds_for_int4_only():
    """row_sumsq and linear_epilogue default to None: in an int4 graph's pass list (int4 pairs / gate_ups only), not
    in a bf16 or fp8 one; an explicit False keeps them out of the int4 one, an explicit True folds bf16 too."""
    def chosen(**kw):
        return {p.name: p for p in PassManager(CompileConfig(**kw)).passes}
    int4 = chosen(quantization="int4")
    assert int4["row_sumsq"].int4_only and int4["linear_epilogue"].int4_only
    for other in (chosen(), chosen(quantization="fp8")):
        assert "row_sumsq" not in other and "linear_epilogue" not in other
    assert "row_sumsq" not in chosen(quantization="int4", row_sumsq=False)
    assert "linear_epilogue" not in chosen(quantization="int4", linear_epilogue=False)
    assert not chosen(quantization="int4", row_sumsq=True)["row_sumsq"].int4_only
    assert PassManager(CompileConfig(quantization="int4")).uuid() != PassManager(
        CompileConfig(quantization="int4", row_sumsq=True, linear_epilogue=True)).uuid()


def test_int4_only_leaves_bf16_pairs(monkeypatch):
    """int4_only (the default's) pairs nothing in a bf16 graph, where the unrestricted pass pairs every norm."""
    monkeypatch.setattr("graphllm.kernels.skinny_matmul.takes_row_sumsq", lambda m, before, after: 1 <= m <= 8)
    before, _ = prepared("llama")
    LinearPrologue()(before)
    after = copy_graph(before)
    assert RowSumsq(int4_only=True)(after) == {"none": 0, "silu": 0, "gelu": 0, "int4": 0}
    assert targets(after) == targets(before)
    assert LinearEpilogue(int4_only=True)(after) == {"add_rms_norm": 0, "none": 0}


def int4_graph(arch: str, epilogue: bool):
    """The tiny graph quantized to int4 and fused as the pass manager leaves it before row_sumsq."""
    from graphllm.passes.fusion.fuse_add_rmsnorm import FuseAddRMSNorm
    from graphllm.passes.fusion.fuse_gate_up import FuseGateUp
    from graphllm.passes.fusion.fuse_qkv import FuseQKV
    from graphllm.passes.fusion.fuse_silu_mul import FuseSiluMul
    from graphllm.passes.lowering.skinny_linear import SkinnyLinear
    from graphllm.passes.quantization.quantize_int4 import QuantizeInt4
    from tests.passes.harness import tiny_step_graph
    graph, config = tiny_step_graph(arch)
    for p in (QuantizeInt4(group_size=32), FuseQKV(), FuseGateUp(), FuseSiluMul(), FuseAddRMSNorm(), SkinnyLinear(),
              LinearPrologue(), *([LinearEpilogue(int4_only=True)] if epilogue else [])):
        p(graph)
    return graph, config


@pytest.mark.parametrize("arch, epilogue", [("llama", False), ("llama", True), ("qwen2", True), ("gemma2", True)])
def test_int4_pairs_every_norm_between_two_int4_linears(arch, epilogue):
    """Each layer's post-attention norm (o_proj -> gate_up) and every input norm after the first (down -> qkv) split
    into int4_linear_add_norm and int4_norm_linear; the first input norm and the final norm stay. Same function."""
    before, config = int4_graph(arch, epilogue)
    after = copy_graph(before)
    counts = RowSumsq(int4_only=True)(after)  # the default's pass: every int4 pair is still taken
    DeadCodeElimination()(after)
    layers = config.num_hidden_layers
    found = targets(after)
    if arch == "gemma2":  # its norms after o_proj and down are the sandwich's own: no product feeds an add directly
        assert counts["int4"] == 0 and ops.int4_norm_linear.default not in found
        return
    assert counts["int4"] == 2 * layers - 1
    assert found.count(ops.int4_linear_add_norm.default) == 2 * layers - 1
    assert found.count(ops.int4_norm_linear.default) == 2 * layers - 1
    assert found.count(ops.add_rms_norm.default) == 1  # the final norm (lm_head's, through the row gather)
    acts = [n.args[-1] for n in after.graph.nodes if n.target == ops.int4_norm_linear.default]
    assert sorted(acts) == [0] * (layers - 1) + [1 if epilogue else 0] * layers  # gate_up's SwiGLU when folded
    assert_same_function(before, after, config, seeds=(1, 2), atol=1e-4)
    from graphllm.compiler.pipeline import kernel_plan  # the manifest names every int4 shape as before
    assert kernel_plan(after, (1,)).keys() == kernel_plan(before, (1,)).keys() and len(kernel_plan(after, (1,))) == 4


def test_int4_ops_equal_their_parts_off_the_kernel_path():
    """CPU: int4_linear_add_norm is int4_linear, the add, h * w and 16-column sums of squares; int4_norm_linear of
    its outputs is int4_linear of the norm's output (rounded), then the activation over column pairs."""
    from graphllm.kernels.quant_layout import quantize_int4_weight
    from graphllm.kernels.reference import reference_rms_norm, reference_silu_and_mul
    from graphllm.ops.quantized_linear import int4_linear, int4_linear_add_norm, int4_norm_linear
    gen = torch.Generator().manual_seed(0)
    x, r = torch.randn(3, 64, generator=gen), torch.randn(3, 32, generator=gen)
    w_norm = torch.randn(32, generator=gen)
    packed, b = quantize_int4_weight(torch.randn(32, 64, generator=gen), 32), torch.randn(32, generator=gen)
    packed2, b2 = quantize_int4_weight(torch.randn(48, 32, generator=gen), 16), torch.randn(48, generator=gen)
    for unit_offset in (False, True):
        xn, h, sumsq = int4_linear_add_norm(x, *packed, b, r, w_norm, 1e-5, unit_offset)
        assert torch.equal(h, int4_linear(x, *packed, b) + r)
        assert torch.equal(xn, h * (w_norm + 1.0 if unit_offset else w_norm))
        torch.testing.assert_close(sumsq.sum(-1), (h * h).sum(-1))
        assert sumsq.shape == (3, 2)
        normed = reference_rms_norm(h, w_norm, 1e-5, unit_offset)
        torch.testing.assert_close(int4_norm_linear(xn, sumsq, 1e-5, *packed2, b2), int4_linear(normed, *packed2, b2))
        gate_up = int4_linear(normed, *packed2, b2)
        torch.testing.assert_close(int4_norm_linear(xn, sumsq, 1e-5, *packed2, b2, 1),
                                   reference_silu_and_mul(torch.cat((gate_up[:, 0::2], gate_up[:, 1::2]), 1)))
