"""The attention backend of the step running now: set by a scope, read by the attention op.

`use_backend(backend)` makes `backend` run every attention op called inside the block, in this
thread or task (a ContextVar), and restores what was there before on exit, also on error.
`active_backend()` is what the op calls; outside every scope it raises instead of falling back
to a default, so a step that forgot its scope fails loudly.
"""

import contextlib
from contextvars import ContextVar
from typing import Iterator

from graphllm.backends.base import AttentionBackend

_active: ContextVar[AttentionBackend | None] = ContextVar("graphllm_attention_backend", default=None)


def active_backend() -> AttentionBackend:
    backend = _active.get()
    if backend is None:
        raise RuntimeError("the attention op ran outside an attention backend's scope: run the model inside "
                           "`with graphllm.backends.use_backend(backend):` (TorchBackend() is the reference)")
    return backend


@contextlib.contextmanager
def use_backend(backend: AttentionBackend) -> Iterator[AttentionBackend]:
    """Make `backend` run the attention op for the steps inside the block; restores on exit."""
    token = _active.set(backend)
    try:
        yield backend
    finally:
        _active.reset(token)
