"""Attention backend choice and scope (CPU): auto picks the reference on CPU, forcing a GPU-only
backend names the reason, and the active backend is scoped to the step."""

import pytest
import torch

import graphllm.ops.attention  # noqa: F401  (registers torch.ops.graphllm.attention)
from graphllm.backends import AttentionShape, TorchBackend, flashinfer_supports, select_backend
from graphllm.ops.attention import active_backend, use_backend


@pytest.fixture
def config(tiny_model_dir) -> AttentionShape:
    """The tiny llama's attention, as the runtime hands it to select_backend."""
    from graphllm.models.loader import read_hf_config
    from graphllm.models.registry import resolve_architecture
    c = resolve_architecture(read_hf_config(tiny_model_dir("llama")[0]))[1]
    return AttentionShape(c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.sliding_window)


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
        super().__init__()
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
    with pytest.raises(RuntimeError, match="outside an attention backend's scope"):
        active_backend()  # the scope ended with the step, and nothing falls back to a default
    with pytest.raises(ZeroDivisionError):
        with use_backend(marker):
            assert active_backend() is marker
            raise ZeroDivisionError
    with pytest.raises(RuntimeError, match="outside an attention backend's scope"):
        active_backend()  # restored on error too


def test_the_op_outside_a_scope_is_an_error():
    """Running the attention op with no backend scoped fails loudly instead of running a default."""
    q = torch.zeros(1, 2, 8)
    cache = torch.zeros(2, 2, 16, 2, 8)
    i64 = dict(dtype=torch.int64)
    with pytest.raises(RuntimeError, match="outside an attention backend's scope"):
        torch.ops.graphllm.attention(q, q, q, cache, torch.zeros(1, **i64), torch.zeros(1, **i64),
                                     torch.zeros(1, 1, **i64), torch.ones(1, **i64), torch.tensor([0, 1]), 1.0, 0)
    with use_backend(TorchBackend()):
        assert torch.ops.graphllm.attention(q, q, q, cache, torch.zeros(1, **i64), torch.zeros(1, **i64),
                                            torch.zeros(1, 1, **i64), torch.ones(1, **i64), torch.tensor([0, 1]),
                                            1.0, 0).shape == q.shape


def test_flashinfer_is_refused_for_layers_that_differ_at_start_not_at_the_first_step(tiny_model_dir):
    from graphllm.models.loader import read_hf_config
    from graphllm.models.registry import resolve_architecture
    from graphllm.runtime.setup import attention_shape
    shapes = {arch: attention_shape(resolve_architecture(read_hf_config(tiny_model_dir(arch)[0]))[1])
              for arch in ("llama", "gemma2")}
    assert shapes["llama"].uniform and not shapes["gemma2"].uniform
    at_128 = shapes["gemma2"]._replace(head_dim=128)  # the tiny model's head_dim 16 is refused first
    assert "layers differ" in (flashinfer_supports(at_128, torch.bfloat16) or "")
    assert shapes["llama"].scale == pytest.approx(shapes["llama"].head_dim ** -0.5)
