"""Preset configs are real Hugging Face configs: transformers reads them (bench --compare
transformers loads the preset folder) and agrees with our own config reader on the shapes."""

import json

import pytest
import transformers

from graphllm.bench.presets import PRESETS
from graphllm.models.registry import resolve_architecture


@pytest.mark.parametrize("name", list(PRESETS))
def test_transformers_reads_the_preset_config(name, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(PRESETS[name]))
    hf = transformers.AutoConfig.from_pretrained(tmp_path)
    _, ours = resolve_architecture(PRESETS[name])
    assert hf.architectures == PRESETS[name]["architectures"]
    assert (hf.num_hidden_layers, hf.num_key_value_heads) == (ours.num_hidden_layers, ours.num_key_value_heads)


def test_phi3_options_we_do_not_support_are_refused_by_name():
    base = dict(PRESETS["phi-3-mini"])
    with pytest.raises(ValueError, match="partial_rotary_factor"):
        resolve_architecture({**base, "partial_rotary_factor": 0.75})
    longrope = {"rope_type": "longrope", "short_factor": [1.0] * 48, "long_factor": [2.0] * 48}
    resolve_architecture({**base, "rope_scaling": longrope})  # supported: tests/models/test_phi3_longrope.py
    with pytest.raises(ValueError, match="long_factor must be a list of 48 numbers"):
        resolve_architecture({**base, "rope_scaling": {**longrope, "long_factor": [2.0] * 47}})


def test_the_echo_preset_repeats_its_last_token():
    import torch

    from graphllm.bench.presets import random_weights
    config = {**PRESETS["llama-3-8b"], "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256}
    usual = random_weights(config, torch.float32, torch.device("cpu"))
    echo = random_weights(config, torch.float32, torch.device("cpu"), echo=True)
    assert usual.keys() == echo.keys()
    for name in usual:
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            assert echo[name].std().item() == pytest.approx(1e-6, rel=0.2)
        elif usual[name].dim() == 2:
            assert echo[name].std().item() == pytest.approx(0.02, rel=0.2)
    assert torch.equal(echo["lm_head.weight"], echo["model.embed_tokens.weight"])
    hf_config = transformers.LlamaConfig(**{k: v for k, v in config.items() if k != "architectures"})
    hf = transformers.LlamaForCausalLM(hf_config)
    hf.load_state_dict(echo)
    out = hf.generate(torch.tensor([[5, 77, 200, 31]]), max_new_tokens=6, do_sample=False)
    assert out[0, 4:].tolist() == [31] * 6


def test_two_benches_write_a_preset_once(tmp_path, monkeypatch):
    """Two benches asking for one preset folder at once (threads: flock's locks belong to open files, so they
    exclude each other as two processes would): one writes it in a staging directory of its own and renames it
    into place, the other waits and reads it; nothing else is left beside it. The writer is a stand-in (a real
    preset is gigabytes); the directories, renames and locks are real."""
    import argparse
    import threading
    import time

    from graphllm.bench import presets
    from graphllm.bench.workload import model_folder

    writes = []

    def write_preset(name, out, overrides=None, echo=False):
        writes.append(out)
        (out / "model.safetensors").write_bytes(b"weights")
        time.sleep(0.5)  # the other bench arrives while this one writes
        (out / "config.json").write_text(json.dumps(PRESETS[name]))
        return out

    monkeypatch.setattr(presets, "write_preset", write_preset)
    args = argparse.Namespace(model=None, preset="qwen3-0.6b", preset_layers=2)
    folders = []
    threads = [threading.Thread(target=lambda: folders.append(model_folder(args, tmp_path))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    folder = tmp_path / "models" / "qwen3-0.6b-2-layers"
    assert folders == [folder, folder] and len(writes) == 1 and writes[0] != folder
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]
    assert sorted(p.name for p in folder.parent.iterdir()) == [folder.name, folder.name + ".lock"]
