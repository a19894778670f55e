"""How graphllm's decode-step kernels launch: programmatic dependent launch (PDL) on Hopper and newer.

A decode step at batch 1 is a chain of ~10 kernels a layer, each streaming a weight of 10-240 MB, and each
costs a few microseconds beyond its bytes: the launch inside the graph, the first wave's ramp (programs that
compute offsets, then wait a DRAM round trip before the first product), the last wave's tail. With PDL a
kernel may start while the kernel before it on the stream is finishing (its programs are scheduled as the
other's programs exit):

    skinny_matmul program:  griddepcontrol.launch_dependents -> offsets -> prefetch its first weight tile
                            into L2 -> griddepcontrol.wait -> read x (the kernel before wrote it), the K loop,
                            stores

launch_dependents lets the next kernel launch once every program of this one has started (its programs then
take the SMs this one's programs leave); griddepcontrol.wait returns once every kernel before has completed
and its writes are visible, so nothing that a kernel before writes is read before it, and nothing is written
before it (a buffer this kernel writes may still be read by the kernel before). The weights are the model's:
no kernel writes them. A kernel launched without PDL after one of these waits for it as usual.

`programmatic_launch(True)` turns it on for the launches inside the block (runtime/setup.py, around the graph
capture, from EngineConfig.enable_pdl, on by default; `--no-enable-pdl` turns it off): the graphs keep the
programmatic edges, so every replay runs them.
The launchers read it through `pdl_launch(device)` (the kernels' side is gdc.py); it is off on the CPU and
before sm_90. The kernels that take it: skinny_matmul, rope_store_kv and paged_decode_attention's two (the
chain of a bf16 decode layer), the quantized decode linears (fp8_matmul up to 16 rows, the int4 GEMV), the row
kernels around them (rms_norm, silu_and_mul, silu_and_mul_fp8) and the MoE kernels (routing, alignment, the two
expert kernels, the k-sum).
Inductor's kernels between them (fp8's norm + quantize, the step's few others) take part when the artifact was
compiled for it (CompileConfig.inductor_pdl: Inductor's own triton.enable_pdl, on by default, and set when an
engine with enable_pdl compiles); an artifact compiled without it keeps them plain launches, which the others wait for as
usual. For graphllm's kernels it changes how a kernel is compiled at run time (a constexpr and Triton's
launch_pdl option), not the artifact.
"""

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterator

import torch

_enabled: ContextVar[bool] = ContextVar("graphllm_programmatic_launch", default=False)


@contextmanager
def programmatic_launch(enabled: bool) -> Iterator[None]:
    """Launch the PDL-capable kernels inside the block as programmatic dependents (enabled) or plainly."""
    token = _enabled.set(enabled)
    try:
        yield
    finally:
        _enabled.reset(token)


def launches_dependent(device: torch.device) -> bool:
    """Whether a kernel launched now on `device` takes PDL: asked for, and a CUDA device of sm_90 or newer."""
    return _enabled.get() and device.type == "cuda" and torch.cuda.get_device_capability(device) >= (9, 0)


def pdl_launch(device: torch.device) -> dict:
    """The launch keywords of a PDL-capable kernel (a PDL constexpr, gdc.py's starts behind it): PDL, and
    Triton's launch_pdl option when it launches as a programmatic dependent."""
    return {"PDL": True, "launch_pdl": True} if launches_dependent(device) else {"PDL": False}
