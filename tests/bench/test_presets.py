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
