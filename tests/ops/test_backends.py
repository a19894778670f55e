"""Attention backend choice and scope (CPU): auto picks the reference on CPU, forcing a GPU-only
backend names the reason, and the active backend is scoped to the step."""

import pytest
import torch

from graphllm.models.config import ModelConfig
from graphllm.ops.backends import TorchBackend, active_backend, flashinfer_supports, select_backend, use_backend


@pytest.fixture
def config(tiny_model_dir) -> ModelConfig:
    from graphllm.models.loader import read_hf_config
    from graphllm.models.registry import resolve_architecture
    return resolve_architecture(read_hf_config(tiny_model_dir("llama")[0]))[1]


CPU = torch.device("cpu")


def test_auto_on_cpu_is_the_reference(config):
    assert select_backend("auto", config, torch.float32, CPU, 16).name == "torch"


def test_flashinfer_on_cpu_names_the_reason(config):
    with pytest.raises(ValueError, match="flashinfer.*CUDA device"):
        select_backend("flashinfer", config, torch.bfloat16, CPU, 16)


def test_flashinfer_refuses_float32(config):
    assert "float16/bfloat16" in (flashinfer_supports(config, torch.float32) or "")


def test_triton_on_cpu_needs_the_interpreter(monkeypatch, config):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="triton.*unavailable"):
        select_backend("triton", config, torch.float32, CPU, 16)


def test_unknown_backend_is_an_error():
    with pytest.raises(ValueError, match="attention_backend"):
        from graphllm.config import EngineConfig
        EngineConfig(attention_backend="xformers")


class Marker(TorchBackend):
    name = "marker"

    def __init__(self):
        self.calls = 0

    def forward(self, *args):
        self.calls += 1
        return super().forward(*args)


def test_scope_routes_the_op_and_restores_on_error(tiny_model_dir):
    from graphllm import Engine, SamplingParams
    path, _ = tiny_model_dir("llama")
    engine = Engine.from_pretrained(path, dtype="float32")
    marker = Marker()
    engine.runner.backend = marker
    engine.generate([[1, 2, 3]], SamplingParams(max_tokens=3, temperature=0))
    assert marker.calls == 3 * engine.state.model_config.num_hidden_layers  # every layer, every step
    assert active_backend().name == "torch"  # the scope ended with the step
    with pytest.raises(RuntimeError):
        with use_backend(marker):
            raise RuntimeError
    assert active_backend().name == "torch"
