"""graphllm.fused_moe equals transformers' sparse MoE blocks (Mixtral, Qwen3-MoE) and the formula computed
token by token in float64; it passes opcheck and stays one node under torch.compile. graphllm.fused_moe_fp8
equals the formula over its dequantized float8 experts."""

import pytest
import torch
import transformers

import graphllm.ops.moe  # noqa: F401  (registers the op)
from graphllm.kernels.fused_moe_reference import quantize_fp8_experts, select_experts

fused_moe = torch.ops.graphllm.fused_moe
fused_moe_fp8 = torch.ops.graphllm.fused_moe_fp8
HIDDEN = 32


def randn(shape, dtype: torch.dtype, seed: int, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * scale).to(dtype)


def operands(num_tokens: int, num_experts: int, size: int, dtype: torch.dtype = torch.float32, seed: int = 0):
    """x [T, H], router_logits [T, E], w13 [E, 2I, H], w2 [E, H, I]."""
    return (randn((num_tokens, HIDDEN), dtype, seed), randn((num_tokens, num_experts), dtype, seed + 1, 2.0),
            randn((num_experts, 2 * size, HIDDEN), dtype, seed + 2, 0.2), randn((num_experts, HIDDEN, size), dtype,
                                                                                 seed + 3, 0.2))


def per_token_formula(x, logits, w13, w2, top_k: int, renormalize: bool) -> torch.Tensor:
    """The definition, one token and one chosen expert at a time, in float64."""
    x, logits, w13, w2 = x.double(), logits.double(), w13.double(), w2.double()
    size, out = w2.shape[2], torch.zeros_like(x)
    for t in range(x.shape[0]):
        probs = logits[t].softmax(-1)
        weights, ids = probs.topk(top_k)
        weights = weights / weights.sum() if renormalize else weights
        for w, e in zip(weights, ids):
            h = w13[e] @ x[t]
            out[t] += w * (w2[e] @ (torch.nn.functional.silu(h[:size]) * h[size:]))
    return out


@pytest.mark.parametrize("renormalize", (True, False))
@pytest.mark.parametrize("num_tokens, num_experts, top_k", [(1, 4, 1), (5, 8, 2), (17, 6, 3), (64, 8, 8)])
def test_equals_the_formula(num_tokens, num_experts, top_k, renormalize):
    x, logits, w13, w2 = operands(num_tokens, num_experts, 24)
    got = fused_moe(x, logits, w13, w2, top_k, renormalize)
    assert got.shape == x.shape and got.dtype == x.dtype and got.is_contiguous()
    torch.testing.assert_close(got.double(), per_token_formula(x, logits, w13, w2, top_k, renormalize),
                               atol=1e-5, rtol=1e-5)


def hf_block(config_cls: str, **moe) -> torch.nn.Module:
    config = getattr(transformers, config_cls)(hidden_size=HIDDEN, num_hidden_layers=1, num_attention_heads=4,
                                               num_key_value_heads=2, vocab_size=16, **moe)
    module = transformers.AutoModelForCausalLM.from_config(config).model.layers[0].mlp
    for p in module.parameters():
        torch.nn.init.normal_(p, std=0.2, generator=torch.Generator().manual_seed(p.numel()))
    return module.eval()


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
@pytest.mark.parametrize("config_cls, moe, renormalize", [
    ("MixtralConfig", dict(num_local_experts=8, num_experts_per_tok=2, intermediate_size=48), True),
    ("Qwen3MoeConfig", dict(num_experts=8, num_experts_per_tok=3, moe_intermediate_size=40, norm_topk_prob=True), True),
    ("Qwen3MoeConfig", dict(num_experts=6, num_experts_per_tok=2, moe_intermediate_size=40, norm_topk_prob=False),
     False)])
def test_equals_the_transformers_block(config_cls, moe, renormalize, dtype):
    block = hf_block(config_cls, **moe).to(dtype)
    x = randn((1, 13, HIDDEN), dtype, seed=5)
    with torch.no_grad():
        expected = block(x)[0]  # [T, H]
        logits = torch.nn.functional.linear(x[0], block.gate.weight)
        got = fused_moe(x[0], logits, block.experts.gate_up_proj, block.experts.down_proj,
                        moe["num_experts_per_tok"], renormalize)
    # float32: rounding only (transformers' grouped_mm); bfloat16: it also sums the k terms in bfloat16 (Qwen3:
    # the weights rounded first), we in float32
    tol = 1e-6 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got, expected, atol=tol, rtol=tol)


def test_routing_softmax_is_float32_and_renormalised():
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]], dtype=torch.bfloat16)
    weights, ids = select_experts(logits, 2, True)
    assert weights.dtype == torch.float32 and ids.tolist() == [[3, 2]]
    torch.testing.assert_close(weights.sum(-1), torch.ones(1))
    raw, _ = select_experts(logits, 2, False)
    torch.testing.assert_close(raw, logits.float().softmax(-1)[:, [3, 2]])


def test_no_tokens():
    x, logits, w13, w2 = operands(0, 4, 8)
    assert fused_moe(x, logits, w13, w2, 2, True).shape == (0, HIDDEN)


def test_shapes_that_do_not_pair_are_refused():
    x, logits, w13, w2 = operands(3, 4, 8)
    with pytest.raises(RuntimeError, match="w2"):
        fused_moe(x, logits, w13, w2[:, :, :4], 2, True)
    with pytest.raises(RuntimeError, match="top_k 5 of 4 experts"):
        fused_moe(x, logits, w13, w2, 5, True)


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
def test_opcheck(dtype):
    x, logits, w13, w2 = operands(6, 4, 8, dtype)
    torch.library.opcheck(fused_moe.default, (x, logits, w13, w2, 2, True))


def test_one_node_under_torch_compile():
    """Dynamic token count, fullgraph: the op is one opaque node, so routing never breaks the graph."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    _, _, w13, w2 = operands(1, 4, 8)
    step = torch.compile(lambda x, logits: fused_moe(x, logits, w13, w2, 2, True) * 2, backend=backend,
                         fullgraph=True, dynamic=True)
    for n in (9, 3):
        x, logits, _, _ = operands(n, 4, 8, seed=n)
        torch.testing.assert_close(step(x, logits), 2 * fused_moe(x, logits, w13, w2, 2, True))
    assert len(graphs) == 1
    targets = [n.target for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert targets.count(fused_moe.default) + targets.count(fused_moe) == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the Triton path runs on CUDA tensors")
@pytest.mark.parametrize("num_tokens", (1, 8, 64, 200))
@pytest.mark.parametrize("num_experts, top_k, size", [(128, 8, 48), (8, 2, 96)])  # Qwen3-MoE's, Mixtral's routing
def test_cuda_equals_the_cpu_reference(num_tokens, num_experts, top_k, size):
    """On CUDA the op runs the Triton kernels (graphllm/kernels/fused_moe.py): the same function as on CPU.
    float32 logits: bfloat16 ones tie, and CPU torch.topk breaks ties its own way."""
    x, logits, w13, w2 = operands(num_tokens, num_experts, size, torch.bfloat16)
    logits = logits.float()
    expected = fused_moe(x, logits, w13, w2, top_k, True)
    got = fused_moe(*(t.cuda() for t in (x, logits, w13, w2)), top_k, True)
    torch.testing.assert_close(got.cpu().float(), expected.float(), atol=2e-2, rtol=2e-2)


def fp8_operands(num_tokens: int, num_experts: int, size: int, dtype: torch.dtype = torch.float32, seed: int = 0):
    """x, router_logits, then the experts quantized: w13 f8 [E, 2I, H], w13_scale [E, 2I], w2 f8, w2_scale."""
    x, logits, w13, w2 = operands(num_tokens, num_experts, size, dtype, seed)
    return (x, logits, *quantize_fp8_experts(w13), *quantize_fp8_experts(w2))


@pytest.mark.parametrize("renormalize", (True, False))
@pytest.mark.parametrize("num_tokens, num_experts, top_k", [(1, 4, 1), (5, 8, 2), (17, 6, 3)])
def test_fp8_equals_the_formula_on_dequantized_experts(num_tokens, num_experts, top_k, renormalize):
    x, logits, w13, s13, w2, s2 = fp8_operands(num_tokens, num_experts, 24)
    got = fused_moe_fp8(x, logits, w13, s13, w2, s2, top_k, renormalize)
    assert got.shape == x.shape and got.dtype == x.dtype
    dequantized = lambda w, scale: w.double() * scale.double()[..., None]  # noqa: E731  W[e, n, :] = w * scale[e, n]
    expected = per_token_formula(x, logits, dequantized(w13, s13), dequantized(w2, s2), top_k, renormalize)
    torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=1e-5)


def test_fp8_experts_round_to_bfloat16_once_where_x_is_bfloat16():
    x, logits, w13, s13, w2, s2 = fp8_operands(7, 8, 24, torch.bfloat16)
    expected = fused_moe(x, logits, (w13.float() * s13[..., None]).bfloat16(), (w2.float() * s2[..., None]).bfloat16(),
                         2, True)
    assert torch.equal(fused_moe_fp8(x, logits, w13, s13, w2, s2, 2, True), expected)


def test_fp8_operands_that_do_not_fit_are_refused():
    x, logits, w13, s13, w2, s2 = fp8_operands(3, 4, 8)
    with pytest.raises(RuntimeError, match=r"w13_scale torch.float32 \(4, 8\); float32 \(4, 16\) expected"):
        fused_moe_fp8(x, logits, w13, s13[:, :8], w2, s2, 2, True)
    with pytest.raises(RuntimeError, match="float8_e4m3fn expected"):
        fused_moe_fp8(x, logits, w13.float(), s13, w2, s2, 2, True)


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
def test_fp8_opcheck(dtype):
    """Without test_schema: its mutation check compares inputs with allclose, which float8 lacks on CPU."""
    args = (*fp8_operands(6, 4, 8, dtype), 2, True)
    torch.library.opcheck(fused_moe_fp8.default, args,
                          test_utils=("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"))
