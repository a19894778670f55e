"""Every way a model folder can be wrong gives an error that names the problem."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from graphllm.models import ModelLoadError, load_model
from tests.tiny_models import make_hf_model, save_model_folder


@pytest.fixture
def folder(tmp_path):
    return save_model_folder(make_hf_model("llama"), tmp_path / "llama")


def rewrite_weights(folder, edit):
    file = folder / "model.safetensors"
    tensors = load_file(file)
    edit(tensors)
    save_file(tensors, file)


def test_loads_and_matches_weights(folder):
    model, config = load_model(folder)
    saved = load_file(folder / "model.safetensors")
    assert torch.equal(model.model.layers[1].mlp.up_proj.weight, saved["model.layers.1.mlp.up_proj.weight"])
    assert config.rope.rope_type == "llama3" and config.num_key_value_heads == 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_dtype(folder, dtype):
    model, _ = load_model(folder, dtype=dtype)
    assert {p.dtype for p in model.parameters()} == {dtype}


def test_sharded_checkpoint(tmp_path):
    hf = make_hf_model("qwen3")
    folder = save_model_folder(hf, tmp_path / "sharded", max_shard_size="40KB")
    assert (folder / "model.safetensors.index.json").is_file()
    assert len(list(folder.glob("*.safetensors"))) > 1
    model, _ = load_model(folder)
    assert torch.equal(model.lm_head.weight, hf.lm_head.weight)


def test_missing_shard_is_named(tmp_path):
    folder = save_model_folder(make_hf_model("qwen3"), tmp_path / "sharded", max_shard_size="40KB")
    victim = sorted(folder.glob("*.safetensors"))[0]
    victim.unlink()
    with pytest.raises(ModelLoadError, match=victim.name):
        load_model(folder)


def test_tied_embeddings_share_storage(tmp_path):
    folder = save_model_folder(make_hf_model("qwen2"), tmp_path / "tied")
    model, config = load_model(folder)
    assert config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_pickle_only_folder_is_refused(folder):
    tensors = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    torch.save(tensors, folder / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match="never unpickles"):
        load_model(folder)


def test_no_weights(folder):
    (folder / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="no \\*.safetensors"):
        load_model(folder)


def test_missing_tensor_is_named(folder):
    rewrite_weights(folder, lambda t: t.pop("model.layers.0.self_attn.k_proj.weight"))
    with pytest.raises(ModelLoadError, match="missing tensor.*model.layers.0.self_attn.k_proj.weight"):
        load_model(folder)


def test_unexpected_tensor_is_named(folder):
    rewrite_weights(folder, lambda t: t.update({"model.layers.0.extra.weight": torch.zeros(2)}))
    with pytest.raises(ModelLoadError, match="unexpected tensor 'model.layers.0.extra.weight'"):
        load_model(folder)


def test_misshaped_tensor_is_named(folder):
    rewrite_weights(folder, lambda t: t.update({"model.norm.weight": torch.zeros(63)}))
    with pytest.raises(ModelLoadError, match=r"'model.norm.weight'.*\(63,\).*\(64,\)"):
        load_model(folder)


def test_unknown_architecture_is_named(folder):
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["GPTBigFooForCausalLM"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="unknown architecture 'GPTBigFooForCausalLM'"):
        load_model(folder)


def test_missing_config(folder):
    (folder / "config.json").unlink()
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_model(folder)


def test_missing_folder(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(tmp_path / "nowhere")


def test_old_rope_buffer_in_checkpoint_is_ignored(folder):
    """Old checkpoints ship rotary_emb.inv_freq: it is skipped, not loaded over the model's own table."""
    clean, _ = load_model(folder)
    rewrite_weights(folder, lambda t: t.update({"model.layers.0.self_attn.rotary_emb.inv_freq": torch.zeros(8)}))
    model, _ = load_model(folder)
    tensors = lambda m: {**dict(m.named_parameters()), **dict(m.named_buffers())}  # noqa: E731  (inv_freq: a buffer)
    state, expected = tensors(model), tensors(clean)
    assert any(name.endswith("inv_freq") for name in state) and state.keys() == expected.keys()
    assert all(torch.equal(state[k], expected[k]) for k in state)


@pytest.mark.parametrize("key, value", [("attn_logit_softcapping", 50.0), ("final_logit_softcapping", 30.0),
                                        ("query_pre_attn_scalar", 256), ("residual_multiplier", 0.22),
                                        ("partial_rotary_factor", 0.5)])
def test_a_field_that_changes_the_math_is_refused_by_name(folder, key, value):
    config = json.loads((folder / "config.json").read_text())
    config[key] = value
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=f"config.json sets {key}="):
        load_model(folder)


# -- s35's fuzzing of the model folder: each case a message naming the file, not a traceback or a silent load --

@pytest.mark.parametrize("damage", ["truncated", "empty", "header", "directory"])
def test_a_damaged_safetensors_file_is_named(folder, damage):
    file = folder / "model.safetensors"
    data = file.read_bytes()
    if damage == "directory":
        file.unlink()
        file.mkdir()
    else:
        file.write_bytes({"truncated": data[: len(data) // 2], "empty": b"", "header": b"\xff" * 64}[damage])
    with pytest.raises(ModelLoadError, match="model.safetensors is not a readable safetensors file"):
        load_model(folder)


@pytest.mark.parametrize("name, text", [("config.json", "[1, 2]"), ("config.json", "64"),
                                        ("model.safetensors.index.json", "[1, 2]"),
                                        ("model.safetensors.index.json", '{"weight_map": [1]}')])
def test_a_json_file_of_the_wrong_shape_is_named(folder, name, text):
    (folder / name).write_text(text)
    with pytest.raises(ModelLoadError, match=name.replace(".", r"\.")):
        load_model(folder)


def test_a_config_that_is_not_utf8_is_named(folder):
    (folder / "config.json").write_bytes(b'{"a": "\xff"}')
    with pytest.raises(ModelLoadError, match="config.json is not valid JSON"):
        load_model(folder)


def test_a_tensor_stored_in_two_files_is_refused_not_loaded_in_file_order(folder):
    """A stray old file beside model.safetensors (no index: every *.safetensors is read) held lm_head again; the
    file read last won, silently."""
    tensors = load_file(folder / "model.safetensors")
    save_file({"lm_head.weight": torch.zeros_like(tensors["lm_head.weight"])}, folder / "zz-old.safetensors")
    with pytest.raises(ModelLoadError, match="'lm_head.weight' is stored twice, in model.safetensors and "
                                             "zz-old.safetensors"):
        load_model(folder)


def test_a_missing_config_field_and_a_bare_architecture_string_are_named(folder):
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "architectures": "LlamaForCausalLM"}))
    with pytest.raises(ValueError, match="'architectures' must be a list"):
        load_model(folder)
    del config["hidden_size"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="lacks the field 'hidden_size'"):
        load_model(folder)


def test_an_artifact_given_as_a_model_folder_is_named(folder):
    (folder / "manifest.json").write_text("{}")  # what makes a folder an artifact
    with pytest.raises(ModelLoadError, match="is a compiled graphllm artifact.*--artifact"):
        load_model(folder)
