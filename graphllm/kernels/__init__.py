"""Triton kernels for the attention op: KV-cache store, paged decode and paged prefill attention.

One kernel per file, each with a plain PyTorch reference beside it (the oracle of
tests/kernels). The kernels read step metadata from device tensors only and size their grids from
shapes alone, so they can be captured in CUDA graphs. Importing these modules needs triton; under
`TRITON_INTERPRET=1` (set before import) they also run on CPU tensors, slowly, for tests.
"""
