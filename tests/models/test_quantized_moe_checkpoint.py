"""Pre-quantized compressed-tensors FP8 checkpoints of mixtures of experts (Mixtral, Qwen3-MoE), written as
llm-compressor publishes them (tests/quantized_checkpoints.py: one fp8 linear per expert and projection, scales per
channel or per tensor, the routers and lm_head in ignore).

The experts land in graphllm.fused_moe_fp8's float8 stacks with the checkpoint's exact bytes and scales (not
quantized again); the step gives transformers' greedy tokens on the library-dequantized weights, run eager (the
captured graph after the passes) and compiled (the artifact); what the fused MoE cannot run is refused by name.
"""

import json
import logging
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from graphllm.config import CompileConfig
from graphllm.ir import capture, op_counts
from graphllm.models.checkpoint_parts import checkpoint_parts
from graphllm.models.loader import ModelLoadError, load_checkpoint
from graphllm.models.registry import resolve_architecture
from graphllm.passes.manager import PassManager, Prequantized
from tests import quantized_checkpoints as qc
from tests.passes.harness import on_reference
from tests.test_quantized_parity import NEW_TOKENS, PROMPTS, transformers_tokens

IGNORE = ("lm_head", qc.ROUTERS)
LAYER0_EXPERTS = r"re:model\.layers\.0\.mlp\.experts\."
WRITERS = {  # the folder's name says fp8: transformers_tokens rounds the dense linears' inputs as W8A8 does
    "mixtral-fp8-tensor-static": lambda p: qc.write_ct_fp8_folder(p, "mixtral", "tensor", dynamic=False,
                                                                  ignore=IGNORE),
    "qwen3_moe-fp8-channel-dynamic": lambda p: qc.write_ct_fp8_folder(p, "qwen3_moe", "channel", ignore=IGNORE),
    "qwen3_moe-fp8-layer0-experts-float": lambda p: qc.write_ct_fp8_folder(p, "qwen3_moe", "channel",
                                                                           ignore=(*IGNORE, LAYER0_EXPERTS)),
}
ROUTER = {"mixtral": "model.layers.{l}.block_sparse_moe.gate", "qwen3_moe": "model.layers.{l}.mlp.gate"}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """name -> its folder, written once for the module."""
    written = {}

    def get(name: str):
        if name not in written:
            written[name] = WRITERS[name](tmp_path_factory.mktemp(name) / name)
        return written[name]
    return get


def step_graph(folder, experts_edit=None):
    """The checkpoint's captured step after the pass pipeline (graphllm compile's passes), and its ModelConfig;
    experts_edit(loaded.experts) may change the float8 stacks first."""
    loaded = load_checkpoint(folder)
    if experts_edit:
        experts_edit(loaded.experts)
    graph = capture(loaded.model, loaded.config, torch.float32, torch.device("cpu"))
    PassManager(CompileConfig(), Prequantized("fp8", loaded.quantized, loaded.experts)).run(graph)
    return graph, loaded.config


def graph_tokens(graph, config, prompts=PROMPTS, new_tokens=NEW_TOKENS) -> list[list[int]]:
    """Greedy continuations from the graph run eagerly, the prompts batched as the engine batches them: one prefill
    step, then decode steps of one token per sequence over the KV cache (sequence i owns blocks 4i .. 4i + 3)."""
    block_size, blocks = 16, 4
    caches = [torch.zeros(config.kv_cache_shape(blocks * len(prompts), block_size))
              for _ in range(config.num_hidden_layers)]
    tables = torch.arange(blocks * len(prompts)).view(len(prompts), blocks)
    seqs, done = [list(p) for p in prompts], [0] * len(prompts)
    for _ in range(new_tokens):
        positions = [torch.arange(d, len(s)) for s, d in zip(seqs, done)]
        ends = torch.tensor([len(p) for p in positions]).cumsum(0)
        with on_reference():
            logits = graph(torch.tensor([t for s, d in zip(seqs, done) for t in s[d:]]), torch.cat(positions),
                           torch.cat([i * blocks * block_size + p for i, p in enumerate(positions)]), tables,
                           torch.tensor([len(s) for s in seqs]), torch.cat([torch.zeros(1, dtype=torch.int64), ends]),
                           ends - 1, caches)  # [B, vocab]
        done = [len(s) for s in seqs]
        for s, row in zip(seqs, logits):
            s.append(int(row.argmax()))
    return [s[len(p):] for s, p in zip(seqs, prompts)]


@pytest.fixture(scope="module")
def expected_tokens(folders, tmp_path_factory):
    """name -> transformers' greedy tokens on the folder's library-dequantized weights."""
    cache = {}

    def get(name: str):
        if name not in cache:
            dequantized = qc.write_dequantized_folder(folders(name), tmp_path_factory.mktemp(name) / "float")
            cache[name] = transformers_tokens(folders(name), dequantized)
        return cache[name]
    return get


# --- loading: the checkpoint's bytes and scales in the stacks ------------------------------------

@pytest.mark.parametrize("name", ["mixtral-fp8-tensor-static", "qwen3_moe-fp8-channel-dynamic"])
def test_expert_stacks_hold_the_checkpoints_fp8_bytes_and_scales(folders, name, caplog):
    with caplog.at_level(logging.WARNING):
        loaded = load_checkpoint(folders(name))
    stored = load_file(folders(name) / "model.safetensors")
    parts = checkpoint_parts(loaded.model)
    assert len(parts) == 3 * loaded.config.num_experts * 2 and len(loaded.experts) == 2 * 2  # 2 stacks x 2 layers
    for weight, part in parts.items():
        prefix, (qweight, scale) = weight.removesuffix(".weight"), loaded.experts[part.parameter].values()
        assert torch.equal(qweight[part.index].view(torch.uint8), stored[weight].view(torch.uint8)), weight
        rows = qweight[part.index].shape[0]  # a per-tensor scale repeated over its rows
        assert torch.equal(scale[part.index], stored[f"{prefix}.weight_scale"].reshape(-1).expand(rows)), prefix
        assert loaded.model.get_parameter(part.parameter).stride() == (0, 0, 0)  # a placeholder: no memory
    router = ROUTER[name.partition("-")[0]].format(l=1)
    assert torch.equal(loaded.model.get_submodule(router).weight, stored[f"{router}.weight"])  # float, as stored
    how = "per token" if name.endswith("dynamic") else "with static input scales"
    assert caplog.text.count("MoE experts: weight-only float8") == 1 and how in caplog.text


def test_per_tensor_scales_of_one_experts_gate_and_up_differ(folders):
    """Each expert linear has its own per-tensor scale: w1 and w3 of one expert are two scales in one stack."""
    stored = load_file(folders("mixtral-fp8-tensor-static") / "model.safetensors")
    expert = "model.layers.0.block_sparse_moe.experts.1"
    w1, w3 = (stored[f"{expert}.{w}.weight_scale"] for w in ("w1", "w3"))
    assert w1.shape == w3.shape == (1,) and w1 != w3
    stack = load_checkpoint(folders("mixtral-fp8-tensor-static")).experts[f"{expert.rpartition('.')[0]}.gate_up_proj"]
    size = stack["qweight"].shape[1] // 2
    assert torch.equal(stack["weight_scale"][1], torch.cat([w1.expand(size), w3.expand(size)]))


def test_autofp8_mixtral_with_scalar_scales_loads_the_same_stacks(folders, tmp_path):
    """quant_method fp8 (AutoFP8, neuralmagic's Mixtral FP8): per-tensor scalars, ignored_layers by name."""
    source = folders("mixtral-fp8-tensor-static")
    folder = shutil.copytree(source, tmp_path / "autofp8")
    routers = [ROUTER["mixtral"].format(l=layer) for layer in range(2)]
    qc.edit_config(folder, lambda c: c.update(quantization_config={
        "quant_method": "fp8", "activation_scheme": "static", "ignored_layers": ["lm_head", *routers]}))
    tensors = load_file(folder / "model.safetensors")
    save_file({n: t.reshape(()) if n.endswith("_scale") else t for n, t in tensors.items()},
              folder / "model.safetensors")
    got, want = load_checkpoint(folder).experts, load_checkpoint(source).experts
    assert sorted(got) == sorted(want)
    assert all(torch.equal(got[n][k].view(torch.uint8), want[n][k].view(torch.uint8)) for n in want for k in want[n])


def test_a_layer_whose_experts_the_checkpoint_keeps_float_loads_float(folders):
    folder = folders("qwen3_moe-fp8-layer0-experts-float")
    loaded, stored = load_checkpoint(folder), load_file(folder / "model.safetensors")
    assert sorted(loaded.experts) == ["model.layers.1.mlp.experts.down_proj", "model.layers.1.mlp.experts.gate_up_proj"]
    experts = loaded.model.model.layers[0].mlp.experts
    assert experts.down_proj.dtype == torch.float32
    assert torch.equal(experts.down_proj[5], stored["model.layers.0.mlp.experts.5.down_proj.weight"])


# --- the graph: fused_moe_fp8 over the checkpoint's tensors --------------------------------------

@pytest.mark.parametrize("name", ["mixtral-fp8-tensor-static", "qwen3_moe-fp8-layer0-experts-float"])
def test_the_graph_runs_fused_moe_fp8_over_the_checkpoints_own_tensors(folders, name):
    graph, config = step_graph(folders(name))
    want = load_checkpoint(folders(name)).experts
    ops = op_counts(graph.gm)
    assert ops["fused_moe_fp8.default"] == len(want) // 2 and ops["fused_moe.default"] == 2 - len(want) // 2
    for stack, tensors in want.items():
        qweight, scale = graph.weights[f"model.{stack}_qweight"], graph.weights[f"model.{stack}_weight_scale"]
        assert torch.equal(qweight.view(torch.uint8), tensors["qweight"].view(torch.uint8))
        assert torch.equal(scale, tensors["weight_scale"])  # per tensor: not max|row| / 448, as re-quantizing gives
        assert f"model.{stack}" not in graph.weights  # the placeholder left
    assert all(w.dtype == torch.float32 for n, w in graph.weights.items() if n.endswith(".gate.weight"))


DOWN1 = "model.layers.1.mlp.experts.down_proj"


@pytest.mark.parametrize("edit, message", [
    (lambda e: e.update({"model.layers.7.mlp.experts.down_proj": e[DOWN1]}),
     "model graph does not have: model.layers.7.mlp.experts.down_proj"),
    (lambda e: e.pop(DOWN1), f"float8 experts for model.layers.1.mlp.experts.gate_up_proj but not {DOWN1}"),
    (lambda e: e.update({DOWN1: {**e[DOWN1], "weight_scale": e[DOWN1]["weight_scale"][:, :5]}}),
     f"{DOWN1} is torch.float8_e4m3fn \\(8, 64, 32\\) with scales torch.float32 \\(8, 5\\)"),
])
def test_checkpoint_experts_that_do_not_fit_the_graph_are_named(folders, edit, message):
    loaded = load_checkpoint(folders("qwen3_moe-fp8-channel-dynamic"))
    graph = capture(loaded.model, loaded.config, torch.float32, torch.device("cpu"))
    edit(loaded.experts)
    with pytest.raises(ValueError, match=message):
        PassManager(CompileConfig(), Prequantized("fp8", loaded.quantized, loaded.experts)).run(graph)


# --- greedy tokens: transformers on the dequantized weights --------------------------------------

@pytest.mark.parametrize("name", WRITERS)
def test_eager_greedy_tokens_equal_transformers_on_the_dequantized_weights(folders, expected_tokens, name):
    graph, config = step_graph(folders(name))
    assert graph_tokens(graph, config) == expected_tokens(name)


def test_swapped_expert_scales_change_the_tokens(folders, expected_tokens):
    """The parity above can fail: two experts' scales exchanged in every stack give other tokens."""
    name = "mixtral-fp8-tensor-static"

    def swap(experts):
        for stack in experts.values():
            stack["weight_scale"][[0, 1]] = stack["weight_scale"][[1, 0]].clone()
    graph, config = step_graph(folders(name), swap)
    assert graph_tokens(graph, config) != expected_tokens(name)


def test_compiled_greedy_tokens_equal_transformers_on_the_dequantized_weights(folders, expected_tokens):
    from graphllm import Engine, EngineConfig, SamplingParams
    from graphllm.compiler.artifact import read_manifest
    from tests.conftest import compile_cached
    name = "qwen3_moe-fp8-channel-dynamic"
    art = compile_cached(EngineConfig(model=str(folders(name))), folders(name))
    passes = {p["name"]: p["counts"] for p in read_manifest(art)["passes"]}
    assert passes["quantize_fp8_experts"] == {"moe_layers": 2} and passes["quantize_fp8"]["quantized"] == 8
    greedy = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    got = [o.outputs[0].token_ids for o in Engine.load(art).generate(PROMPTS, greedy)]
    assert got == expected_tokens(name)


# --- refused by name -----------------------------------------------------------------------------

def with_quantization(folders, arch: str, quantization_config: dict) -> dict:
    """The config.json of the tiny `arch` checkpoint with another quantization_config."""
    name = next(n for n in WRITERS if n.startswith(f"{arch}-"))
    return {**json.loads((folders(name) / "config.json").read_text()), "quantization_config": quantization_config}


FP8_CT = qc.ct_config(dict(strategy="channel"), dict(strategy="token", dynamic=True), "float-quantized",
                      list(IGNORE), None)
W4A16_CT = qc.ct_config(dict(num_bits=4, type="int", strategy="group", group_size=32), None, "pack-quantized",
                        list(IGNORE), None)


@pytest.mark.parametrize("arch, config, message", [
    ("mixtral", {"quant_method": "gptq", "bits": 4, "group_size": 128}, "quant_method='gptq' .*no int4 path"),
    ("qwen3_moe", {"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm", "zero_point": True},
     "quant_method='awq' .*no int4 path"),
    ("qwen3_moe", W4A16_CT, "quant_method='compressed-tensors' \\(int4\\).*no int4 path"),
    ("qwen3_moe", {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]},
     "weight_block_size=\\[128, 128\\]"),
    ("mixtral", {**FP8_CT, "config_groups": {"group_0": {**FP8_CT["config_groups"]["group_0"], "weights": {
        "num_bits": 8, "type": "float", "strategy": "block", "block_structure": [128, 128]}}}},
     "weights.strategy='block'"),
])
def test_what_the_fused_moe_cannot_run_is_refused_by_name(folders, arch, config, message):
    resolve_architecture(with_quantization(folders, arch, FP8_CT))  # fp8 per channel or tensor is accepted
    with pytest.raises(ValueError, match=message):
        resolve_architecture(with_quantization(folders, arch, config))


@pytest.mark.parametrize("arch", ["mixtral", "qwen3_moe"])
def test_a_quantized_router_is_refused_by_name(arch, tmp_path):
    folder = qc.write_ct_fp8_folder(tmp_path / arch, arch, ignore=("lm_head",))  # routers quantized too
    router = ROUTER[arch].format(l=0)
    with pytest.raises(ModelLoadError, match=f"router '{router}' is quantized \\(not in ignore\\)"):
        load_checkpoint(folder)


def test_a_layer_with_some_experts_quantized_is_refused_by_name(tmp_path):
    folder = qc.write_ct_fp8_folder(tmp_path / "part", "qwen3_moe", ignore=(*IGNORE, r"re:.*experts\.3\.up_proj$"))
    with pytest.raises(ModelLoadError, match="experts of 'model.layers.0.mlp.experts' are partly quantized "
                                             r"\('model.layers.0.mlp.experts.0.gate_proj' is, "
                                             r"'model.layers.0.mlp.experts.3.up_proj' is in ignore\)"):
        load_checkpoint(folder)


@pytest.mark.parametrize("suffix, damage, message", [
    ("weight_scale", None, "missing tensor 'model.layers.1.block_sparse_moe.experts.2.w3.weight_scale'"),
    ("weight", lambda t: t[:, :5].contiguous(), "'model.layers.1.block_sparse_moe.experts.2.w3.weight' has shape "
                                                r"\(128, 5\), expected \(128, 64\)"),
    ("input_scale", lambda t: t.expand(4).contiguous(), "'model.layers.1.block_sparse_moe.experts.2.w3.input_scale' "
                                                        r"has shape \(4,\)"),
])
def test_a_damaged_expert_tensor_is_named(folders, tmp_path, suffix, damage, message):
    folder = shutil.copytree(folders("mixtral-fp8-tensor-static"), tmp_path / "damaged")
    key = f"model.layers.1.block_sparse_moe.experts.2.w3.{suffix}"
    tensors = load_file(folder / "model.safetensors")
    tensors.pop(key) if damage is None else tensors.update({key: damage(tensors[key])})
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(ModelLoadError, match=message):
        load_checkpoint(folder)


# --- the writer against the installed library ----------------------------------------------------

def test_ct_fp8_per_tensor_writer_matches_the_library_compressor():
    ct = pytest.importorskip("compressed_tensors")
    from compressed_tensors.compressors.naive_quantized.base import FloatQuantizationCompressor
    scheme = ct.quantization.QuantizationScheme(
        targets=["Linear"], weights=ct.quantization.QuantizationArgs(num_bits=8, type="float", strategy="tensor"),
        input_activations=ct.quantization.QuantizationArgs(num_bits=8, type="float", strategy="tensor"))
    w = torch.randn(128, 64, generator=torch.Generator().manual_seed(0)) * 0.1  # an expert's w1 [I, H]
    weight, scale = qc.ct_fp8_quantize(w, per_tensor=True)
    compressed = FloatQuantizationCompressor.compress({"weight": w, "weight_scale": scale}, scheme)
    assert torch.equal(compressed["weight"].view(torch.uint8), weight.view(torch.uint8))
    assert torch.equal(FloatQuantizationCompressor.decompress(compressed, scheme)["weight"],
                       qc.dequantize_linear("compressed-tensors", {}, {"weight": weight, "weight_scale": scale}))
    config = json.loads(json.dumps(qc.ct_config(dict(strategy="tensor"), dict(strategy="tensor"),
                                                "float-quantized", list(IGNORE), None)))
    ct.QuantizationConfig.model_validate(config)
