"""Mixtral and Qwen3-MoE: the published per-expert checkpoints load into the stacked experts, the registry
builds the layers transformers builds and refuses by name what the fused MoE does not do, the captured
step keeps one graphllm.fused_moe node per sparse layer through the pass pipeline, tensor parallelism is
refused, int8 / int4 leave the experts float (saying so), and an fp8 artifact gives the greedy tokens of
the model on its fp8-dequantized weights. Greedy parity with transformers, eager and from the compiled
artifact: tests/test_parity.py (CONFIGS "mixtral", "qwen3_moe", "qwen3_moe-mixed")."""

import json
import logging

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from graphllm.config import CompileConfig
from graphllm.ir import op_counts
from graphllm.models import ModelLoadError, load_model, resolve_architecture
from graphllm.passes.parallel.shard_tp import ShardTP
from tests.passes.harness import assert_same_function, copy_graph, tiny_step_graph
from tests.tiny_models import make_hf_model, save_model_folder

EXPERT = {"mixtral": "model.layers.{l}.block_sparse_moe.experts", "qwen3_moe": "model.layers.{l}.mlp.experts"}
NAMES = {"mixtral": ("w1", "w3", "w2"), "qwen3_moe": ("gate_proj", "up_proj", "down_proj")}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """arch -> (the saved folder, the transformers model)."""
    out = {}
    for arch in EXPERT:
        hf = make_hf_model(arch)
        out[arch] = (save_model_folder(hf, tmp_path_factory.mktemp(arch)), hf)
    return out


def copy_folder(src, dst):
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def edit_weights(folder, edit):
    tensors = load_file(folder / "model.safetensors")
    edit(tensors)
    save_file(tensors, folder / "model.safetensors")


@pytest.mark.parametrize("arch", EXPERT)
def test_per_expert_checkpoint_fills_the_stacked_experts(arch, folders):
    folder, hf = folders[arch]
    saved = load_file(folder / "model.safetensors")
    prefix = EXPERT[arch].format(l=1)
    assert f"{prefix}.3.{NAMES[arch][0]}.weight" in saved and f"{prefix}.gate_up_proj" not in saved  # as published
    model, config = load_model(folder)
    experts = model.get_submodule(prefix)
    gate, up, down = (saved[f"{prefix}.3.{n}.weight"] for n in NAMES[arch])
    size = config.moe_intermediate_size
    assert torch.equal(experts.gate_up_proj[3, :size], gate) and torch.equal(experts.gate_up_proj[3, size:], up)
    assert torch.equal(experts.down_proj[3], down)
    assert torch.equal(experts.gate_up_proj, hf.model.layers[1].mlp.experts.gate_up_proj)  # transformers' layout
    assert torch.equal(experts.down_proj, hf.model.layers[1].mlp.experts.down_proj)


def test_stacked_layout_and_sharded_files_load_too(folders, tmp_path):
    folder, hf = folders["qwen3_moe"]
    model, _ = load_model(folder)
    whole = tmp_path / "whole"
    whole.mkdir()
    (whole / "config.json").write_text((folder / "config.json").read_text())
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, whole / "model.safetensors")
    again, _ = load_model(whole)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
    sharded = save_model_folder(hf, tmp_path / "sharded", max_shard_size="40KB")  # experts split across files
    assert len(list(sharded.glob("*.safetensors"))) > 2
    third, _ = load_model(sharded)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), third.state_dict().values()))


def test_a_missing_or_misshaped_expert_is_named(folders, tmp_path):
    folder = copy_folder(folders["mixtral"][0], tmp_path / "missing")
    edit_weights(folder, lambda t: t.pop("model.layers.0.block_sparse_moe.experts.2.w3.weight"))
    with pytest.raises(ModelLoadError, match=r"missing tensor\(s\): model.layers.0.block_sparse_moe.experts.2.w3"):
        load_model(folder)
    folder = copy_folder(folders["mixtral"][0], tmp_path / "misshaped")
    name = "model.layers.1.block_sparse_moe.experts.0.w2.weight"
    edit_weights(folder, lambda t: t.update({name: t[name][:, :5].contiguous()}))
    with pytest.raises(ModelLoadError, match=f"'{name}'.*\\(64, 5\\)"):
        load_model(folder)


@pytest.mark.parametrize("step, dense", [(1, []), (2, []), (1, [0, 3]), (3, [2])])
def test_sparse_layers_are_the_ones_transformers_builds(step, dense):
    hf_config = transformers.Qwen3MoeConfig(hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
                                            num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1,
                                            num_experts=4, num_experts_per_tok=2, vocab_size=16,
                                            decoder_sparse_step=step, mlp_only_layers=dense)
    hf = transformers.AutoModelForCausalLM.from_config(hf_config)
    expected = tuple(i for i, layer in enumerate(hf.model.layers) if hasattr(layer.mlp, "experts"))
    hf_dict = {**hf_config.to_dict(), "architectures": ["Qwen3MoeForCausalLM"]}
    module_cls, config = resolve_architecture(hf_dict)
    assert config.sparse_layers == expected
    with torch.device("meta"):
        model = module_cls(config)
    assert tuple(i for i, layer in enumerate(model.model.layers) if hasattr(layer.mlp, "experts")) == expected


def moe_config(arch: str, **changes) -> dict:
    base = {"mixtral": transformers.MixtralConfig(num_local_experts=4, num_experts_per_tok=2),
            "qwen3_moe": transformers.Qwen3MoeConfig(num_experts=4, num_experts_per_tok=2)}[arch]
    cls = {"mixtral": "MixtralForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}[arch]
    return {**base.to_dict(), "architectures": [cls], **changes}


@pytest.mark.parametrize("arch, key, value, message", [
    ("mixtral", "hidden_act", "gelu", "hidden_act='gelu'"),
    ("mixtral", "num_experts_per_tok", 5, "num_experts_per_tok=5 for 4 experts"),
    ("mixtral", "quantization_config", {"quant_method": "gptq", "bits": 4, "group_size": 128},
     "quant_method='gptq'.*pre-quantized Mixtral.*fp8 only"),
    ("qwen3_moe", "use_sliding_window", True, "use_sliding_window"),
    ("qwen3_moe", "shared_expert_intermediate_size", 512, "shared_expert_intermediate_size.*shared expert"),
    ("qwen3_moe", "attn_logit_softcapping", 30.0, "attn_logit_softcapping"),
    ("qwen3_moe", "rope_parameters", {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6}, "yarn")])
def test_what_the_fused_moe_does_not_do_is_refused_by_name(arch, key, value, message):
    resolve_architecture(moe_config(arch))  # the unchanged config is accepted
    with pytest.raises(ValueError, match=message):
        resolve_architecture(moe_config(arch, **{key: value}))


def test_training_only_router_fields_are_accepted():
    _, config = resolve_architecture(moe_config("mixtral", router_aux_loss_coef=0.5, router_jitter_noise=0.1,
                                                output_router_logits=True))
    assert config.norm_topk_prob and config.num_experts == 4 and config.sparse_layers == tuple(range(32))
    _, config = resolve_architecture(moe_config("qwen3_moe", num_experts=0))  # no experts: a dense Qwen3
    assert config.sparse_layers == ()


@pytest.mark.parametrize("arch", ("mixtral", "qwen3_moe-mixed"))
def test_the_step_keeps_one_fused_moe_node_per_sparse_layer_through_the_passes(arch):
    from graphllm.passes.manager import PassManager
    before, config = tiny_step_graph(arch)
    ops = op_counts(before.gm)
    assert ops["fused_moe.default"] == len(config.sparse_layers) > 0
    assert not {"nonzero.default", "where.default", "index_add.default", "item.default"} & set(ops)  # no routing
    after = copy_graph(before)
    PassManager(CompileConfig()).run(after)
    assert op_counts(after.gm)["fused_moe.default"] == len(config.sparse_layers)
    assert_same_function(before, after, config, seeds=(1,), atol=1e-4)


def test_eager_tensor_parallelism_is_refused_by_name():
    """Compiled artifacts shard the experts (tests/runtime/test_tensor_parallel.py); eager ranks, which read
    their own slices of the checkpoint, do not yet."""
    from graphllm.bench.presets import PRESETS
    for name, arch in (("mixtral-8x7b", "MixtralForCausalLM"), ("qwen3-30b-a3b", "Qwen3MoeForCausalLM")):
        _, config = resolve_architecture(PRESETS[name])
        with pytest.raises(ValueError, match=f"{arch} is a mixture of experts: eager tensor parallelism"):
            ShardTP.for_model(config, 0, 2, "0", eager=True)


def test_an_eager_engine_at_tp2_refuses_before_any_worker_starts(tiny_model_dir):
    import torch.distributed as dist

    from graphllm import Engine
    with pytest.raises(ValueError, match="MixtralForCausalLM is a mixture of experts"):
        Engine.from_pretrained(tiny_model_dir("mixtral")[0], tensor_parallel_size=2, compile=False)
    assert not dist.is_initialized()


@pytest.mark.parametrize("scheme", ("int8", "int4"))
def test_quantization_leaves_the_experts_float_and_says_so(scheme, caplog):
    from graphllm.compiler.pipeline import unquantized_expert_share
    from graphllm.passes.manager import quantization_pass
    graph, config = tiny_step_graph("qwen3_moe")
    kept = {n: w.clone() for n, w in graph.weights.items() if ".experts." in n or n.endswith(".gate.weight")}
    assert any(n.endswith(".gate.weight") for n in kept)
    quantization_pass(CompileConfig(quantization=scheme), None)(graph)
    assert op_counts(graph.gm)["fused_moe.default"] == len(config.sparse_layers)
    assert all(torch.equal(graph.weights[n], w) for n, w in kept.items())  # experts and routers stay float
    with caplog.at_level(logging.WARNING):
        share = unquantized_expert_share(graph, CompileConfig(quantization=scheme))
    assert 0.1 < share < 1 and f"--quantization {scheme} leaves the MoE experts in float32" in caplog.text
    assert unquantized_expert_share(graph, CompileConfig()) is None


def test_fp8_quantizes_the_experts_too_and_keeps_the_routers(caplog):
    from graphllm.compiler.pipeline import unquantized_expert_share
    from graphllm.passes.manager import PassManager
    graph, config = tiny_step_graph("qwen3_moe")
    routers = {n: w.clone() for n, w in graph.weights.items() if n.endswith(".gate.weight")}
    PassManager(CompileConfig(quantization="fp8")).run(graph)
    assert op_counts(graph.gm)["fused_moe_fp8.default"] == len(config.sparse_layers)
    assert all(torch.equal(graph.weights[n], w) for n, w in routers.items())
    assert not [n for n, w in graph.weights.items() if ".experts." in n and w.dtype != torch.float8_e4m3fn
                and not n.endswith("_weight_scale")]
    with caplog.at_level(logging.WARNING):
        assert unquantized_expert_share(graph, CompileConfig(quantization="fp8")) is None  # nothing left to say
    assert "leaves the MoE experts" not in caplog.text


def fp8_dequantized(hf: transformers.PreTrainedModel) -> transformers.PreTrainedModel:
    """A copy of hf as --quantization fp8 computes it: every linear but lm_head W8A8 (its weight fp8-dequantized,
    its input rounded to float8 per token), the experts' stacks fp8-dequantized (weight-only), routers as they are."""
    import copy

    from graphllm.kernels import quant_layout as Q

    def fp8_rounded(w: torch.Tensor) -> torch.Tensor:  # [..., N, K]: each output row quantized on its own
        rows = w.reshape(-1, w.shape[-1])
        return Q.dequantize_per_channel(*Q.quantize_fp8_weight(rows)).to(w.dtype).view(w.shape)

    def round_rows(_, args):
        rows = args[0].reshape(-1, args[0].shape[-1])
        xq, scale = Q.quantize_fp8_rows(rows)
        return ((xq.float() * scale).to(args[0].dtype).view(args[0].shape),)

    model = copy.deepcopy(hf)
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and name != "lm_head":
                module.weight.copy_(fp8_rounded(module.weight))
                module.register_forward_pre_hook(round_rows)
            elif name.endswith(".experts"):
                for stack in (module.gate_up_proj, module.down_proj):
                    stack.copy_(fp8_rounded(stack))
    return model


@pytest.mark.parametrize("arch", EXPERT)
def test_fp8_artifact_gives_the_tokens_of_the_fp8_dequantized_model(arch, folders):
    """The whole pipeline (quantize_fp8 and quantize_fp8_experts, fusions, AOTInductor, Engine.load) against
    transformers on the weights fp8 rounds them to; the experts run graphllm.fused_moe_fp8."""
    from graphllm import Engine, EngineConfig, SamplingParams
    from graphllm.compiler.artifact import read_manifest
    from tests.conftest import compile_cached
    from tests.test_quantized_parity import PROMPTS
    folder, hf = folders[arch]
    art = compile_cached(EngineConfig(model=str(folder), dtype="float32", quantization="fp8"), folder)
    reports = {p["name"]: p["counts"] for p in read_manifest(art)["passes"]}
    assert reports["quantize_fp8_experts"] == {"moe_layers": hf.config.num_hidden_layers}
    greedy = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    got = [o.outputs[0].token_ids for o in Engine.load(art).generate(PROMPTS, greedy)]
    reference = fp8_dequantized(hf)
    with torch.no_grad():
        expected = [reference.generate(torch.tensor([p]), max_new_tokens=16, do_sample=False, eos_token_id=None,
                                       pad_token_id=0)[0, len(p):].tolist() for p in PROMPTS]
    assert got == expected


def test_a_preset_folder_reads_in_graphllm_and_transformers_alike(tmp_path):
    """The preset writer names experts as published: both loaders read it and compute the same logits."""
    from graphllm.bench.presets import PRESETS, random_weights
    small = dict(hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=4, num_experts_per_tok=2,
                 vocab_size=128)
    config = {**PRESETS["qwen3-30b-a3b"], **small}
    (tmp_path / "config.json").write_text(json.dumps(config))
    weights = random_weights(config, torch.float32, torch.device("cpu"))
    assert "model.layers.0.mlp.experts.3.up_proj.weight" in weights
    save_file(weights, tmp_path / "model.safetensors")
    model, _ = load_model(tmp_path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    assert torch.equal(model.model.layers[1].mlp.experts.down_proj, hf.model.layers[1].mlp.experts.down_proj)
