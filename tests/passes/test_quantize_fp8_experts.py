"""QuantizeFP8Experts: every graphllm.fused_moe becomes graphllm.fused_moe_fp8 over float8 experts with a scale
per output row; the graph computes what the model with the dequantized experts computes, the router stays
float, and with --quantization fp8 the pass runs after a rank's shard_tp, so each rank quantizes its rows."""

import pytest
import torch

from graphllm.config import CompileConfig
from graphllm.ir import op_counts
from graphllm.kernels.fused_moe_reference import quantize_fp8_experts
from graphllm.passes.manager import PassManager, build_pass_list
from graphllm.passes.quantization.quantize_fp8_experts import QuantizeFP8Experts
from tests.passes.harness import assert_same_function, copy_graph, logits_relative_error, run_pass, tiny_step_graph

STACKS = ("gate_up_proj", "down_proj")


@pytest.fixture(scope="module", params=("mixtral", "qwen3_moe-mixed", "deepseek_v2"))
def quantized(request):
    """Every layer sparse; layer 0 dense (tied embeddings); routed experts scaled beside shared ones."""
    return run_pass(QuantizeFP8Experts(), request.param)


def experts_of(graph) -> list[str]:
    """The float expert stacks' names (<experts module>.gate_up_proj / .down_proj)."""
    return [name for name in graph.weights if name.rpartition(".")[2] in STACKS]


def dequantized(after, name: str) -> torch.Tensor:
    """The float8 stack `after` holds for `name`, dequantized: W[e, n, k] = w[e, n, k] * scale[e, n]."""
    return after.weights[f"{name}_qweight"].float() * after.weights[f"{name}_weight_scale"][..., None]


def dequantized_experts_twin(before, after):
    """`before` with each float expert stack replaced by `after`'s float8 stack, dequantized."""
    twin = copy_graph(before)
    for name in experts_of(twin):
        twin.weights[name].copy_(dequantized(after, name))
    return twin


def test_computes_the_model_on_dequantized_experts(quantized):
    before, after, _, _, _, config = quantized
    assert_same_function(dequantized_experts_twin(before, after), after, config, seeds=(1, 2))


def test_close_to_the_float_model(quantized):
    before, after, _, _, _, config = quantized
    assert 1e-4 < logits_relative_error(before, after, config) < 0.1  # 3 mantissa bits, weights only


def test_counts_ops_and_weights(quantized):
    before, after, counts, ops_before, ops_after, config = quantized
    layers = len(config.sparse_layers)
    assert counts == {"moe_layers": layers} and ops_before["fused_moe.default"] == layers
    assert ops_after["fused_moe_fp8.default"] == layers and "fused_moe.default" not in ops_after
    assert ops_after["linear.default"] == ops_before["linear.default"]  # dense linears and routers untouched
    assert not experts_of(after)  # the float experts left the weights
    routers = [n for n in before.weights if n.endswith(".gate.weight")]
    assert len(routers) == layers and all(torch.equal(after.weights[n], before.weights[n]) for n in routers)
    for name in experts_of(before):
        qweight, scale = after.weights[f"{name}_qweight"], after.weights[f"{name}_weight_scale"]
        assert qweight.dtype == torch.float8_e4m3fn and qweight.shape == before.weights[name].shape
        assert scale.dtype == torch.float32 and scale.shape == qweight.shape[:2]
        assert torch.equal(qweight.float().abs().amax(dim=2), torch.full_like(scale, 448.0))  # each row's max: 448
        torch.testing.assert_close(dequantized(after, name), before.weights[name], atol=1e-3, rtol=0.07)  # 2^-4


def test_runs_with_fp8_only_and_after_the_linears():
    names = lambda scheme: [p.name for p in build_pass_list(CompileConfig(quantization=scheme))]  # noqa: E731
    assert names("fp8")[1:3] == ["quantize_fp8", "quantize_fp8_experts"]
    assert all("quantize_fp8_experts" not in names(s) for s in ("int8", "int4", None))


def test_after_shard_tp_each_rank_quantizes_its_rows_of_every_expert():
    """Rank r of 2 holds rows [r*I/2, (r+1)*I/2) of the gate and of the up half: the same rows, scales and all,
    as the whole stack quantized; its down projection's columns get scales of their own (max over those)."""
    from graphllm.passes.parallel.shard_tp import TP_GROUP, ShardTP
    graph, config = tiny_step_graph("mixtral")
    size, layers = config.moe_intermediate_size, len(config.sparse_layers)
    whole = {n: quantize_fp8_experts(w) for n, w in graph.weights.items() if n.rpartition(".")[2] in STACKS}
    for rank in range(2):
        shard = copy_graph(graph)
        manager = PassManager(CompileConfig(quantization="fp8"), None, ShardTP.for_model(config, rank, 2, TP_GROUP))
        reports = {r.name: r.counts for r in manager.run(shard)}
        assert reports["shard_tp"]["experts"] == reports["quantize_fp8_experts"]["moe_layers"] == layers
        assert op_counts(shard.gm)["fused_moe_fp8.default"] == layers
        mine = slice(rank * size // 2, (rank + 1) * size // 2)
        for name, (qweight, scale) in whole.items():
            got, got_scale = shard.weights[f"{name}_qweight"], shard.weights[f"{name}_weight_scale"]
            if name.endswith("gate_up_proj"):
                rows = torch.cat([torch.arange(size)[mine], size + torch.arange(size)[mine]])
                assert torch.equal(got_scale, scale[:, rows])
                assert torch.equal(got.view(torch.uint8), qweight[:, rows].view(torch.uint8))
            else:
                assert got.shape == (qweight.shape[0], qweight.shape[1], size // 2)
                assert torch.equal(got_scale, quantize_fp8_experts(graph.weights[name][:, :, mine])[1])


def test_shard_tp_refuses_experts_already_in_float8():
    """The pipeline shards before it quantizes; a graph whose experts are float8 already is refused by name,
    never left unsharded."""
    from graphllm.passes.parallel.shard_tp import TP_GROUP, ShardTP
    graph, config = tiny_step_graph("mixtral")
    QuantizeFP8Experts()(graph)
    with pytest.raises(ValueError, match="fused_moe_fp8"):
        ShardTP.for_model(config, 0, 2, TP_GROUP)(graph)
