"""The triton attention backend runs a step padded to a mixed-graph bucket (inputs.pad_mixed: padding sequences,
empty ones among them) with the unpadded step's logits and K/V for the real rows, as the reference backend does
in tests/runtime/test_mixed_graphs.py (on CPU under Triton's interpreter)."""

import pytest

pytest.importorskip("triton")

from graphllm.backends.triton_backend import TritonBackend  # noqa: E402
from graphllm.ir.capture import StepModule  # noqa: E402
from graphllm.models.loader import load_model  # noqa: E402
from tests.kernels.conftest import DEVICE  # noqa: E402
from tests.runtime.test_mixed_graphs import BLOCK, MAX_BLOCKS, check_padded_step  # noqa: E402


@pytest.mark.skipif(DEVICE.type != "cpu", reason="the CPU check; tests/gpu/test_mixed_graphs.py replays graphs")
@pytest.mark.parametrize("arch", ["llama", "gemma2"])  # gemma2: per-layer windows and the soft cap
def test_triton_backend_computes_the_unpadded_rows(arch, tiny_model_dir):
    path, _ = tiny_model_dir(arch)
    model, config = load_model(path)
    assert TritonBackend().mixed_step_graphs
    check_padded_step(StepModule(model), config, TritonBackend(), tokens=12 + 2 * MAX_BLOCKS * BLOCK, seqs=6)
