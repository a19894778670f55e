"""--calculate-kv-scales: the fp8 KV cache's scales from one calibration prefill at start-up.

vLLM computes k_scale = amax(K) / 200 and v_scale = amax(V) / 100 from the first forward pass
(K_SCALE_CONSTANT, V_SCALE_CONSTANT: the headroom left for later tokens whose K/V run larger).
graphllm's decode steps are CUDA graphs with the scales baked in, captured before the first
request, so the pass runs at start-up instead: CALIBRATION_TEXT through the step (compiled or
eager, the same callable that serves) into a temporary KV cache in the model's dtype, then each
layer's amax of what it wrote: one KVScales per layer, as vLLM keeps them.
"""

import torch

from graphllm.backends import AttentionShape, select_backend
from graphllm.kernels.kv_quant import KVScales
from graphllm.models.config import ModelConfig
from graphllm.ops.attention import use_backend
from graphllm.runtime.kv_cache import allocate_kv_caches
from graphllm.runtime.inputs import prepare_step
from graphllm.runtime.sampling_params import SamplingParams
from graphllm.runtime.scheduler import ScheduledSeq
from graphllm.runtime.sequence import Sequence

K_SCALE_CONSTANT, V_SCALE_CONSTANT = 200.0, 100.0  # vLLM's
CALIBRATION_TEXT = (
    "The history of computing is a story of people who wanted answers faster than they could find them "
    "by hand. In 1945 a room-sized machine added five thousand numbers a second; today a phone does "
    "billions. Question: what is 23 plus 45? Answer: 68. def add(a, b):\n    return a + b\n"
    "Les langues, les nombres et le code partagent une structure: des symboles, des règles, du sens.")


def calibration_ids(tokenizer, vocab_size: int) -> list[int]:
    """CALIBRATION_TEXT's tokens, or a fixed spread of ids for a model without a tokenizer."""
    if tokenizer is not None:
        ids = [i for i in tokenizer.encode(CALIBRATION_TEXT) if i < vocab_size]
        if len(ids) >= 8:
            return ids
    return [(i * 7919) % vocab_size for i in range(128)]


@torch.inference_mode()
def calculate_kv_scales(step, model_config: ModelConfig, tokenizer, shape: AttentionShape, dtype: torch.dtype,
                        device: torch.device, block_size: int) -> list[KVScales]:
    """Per layer, KVScales(amax(K) / 200, amax(V) / 100) over one prefill of the calibration text."""
    ids = calibration_ids(tokenizer, model_config.vocab_size)
    num_blocks = max(2, -(-len(ids) // block_size))
    caches = allocate_kv_caches(model_config, num_blocks, block_size, dtype, device)  # [2, blocks, bs, Hkv, D]
    seq = Sequence(0, "calibration", 0, list(ids), len(ids), SamplingParams(max_tokens=1),
                   block_table=list(range(num_blocks)))
    host = prepare_step([ScheduledSeq(seq, len(ids))], block_size)
    backend = select_backend("auto", shape, dtype, device, block_size, dtype)
    with use_backend(backend):
        backend.plan(host.attention)
        step(*host.to_device(caches, device).flat())
    amax = [(max(c[0].abs().amax().item(), 1e-6), max(c[1].abs().amax().item(), 1e-6)) for c in caches]
    return [KVScales(k / K_SCALE_CONSTANT, v / V_SCALE_CONSTANT) for k, v in amax]
