"""While lowering, graphllm's op schemas are part of Inductor's cache keys (compiler/decompositions.py)."""

import pytest
import torch

from graphllm.compiler.decompositions import inductor_decompositions, op_schemas_tag

pytestmark = pytest.mark.skipif(not hasattr(torch.compiler.config, "cache_key_tag"),
                                reason="this torch has no torch.compiler.config.cache_key_tag")


def test_the_tag_follows_the_op_schemas(monkeypatch):
    """Any schema changed (here: an argument added to one op) gives another tag; the same schemas, the same."""
    tag = op_schemas_tag()
    assert tag == op_schemas_tag() and tag.startswith("graphllm-ops-")
    real = torch._C._jit_get_all_schemas()
    fp8 = next(i for i, s in enumerate(real) if s.name == "graphllm::fp8_linear")
    changed = [str(s) for s in real]
    changed[fp8] = changed[fp8].replace(")", ", SymInt extra=0)", 1)  # an argument added to fp8_linear

    class Schema:
        def __init__(self, text):
            self.text, self.name = text, text.split("(")[0]

        def __str__(self):
            return self.text

    monkeypatch.setattr(torch._C, "_jit_get_all_schemas", lambda: [Schema(t) for t in changed])
    assert op_schemas_tag() != tag


def test_lowering_sets_the_tag_beside_the_users_and_restores_it():
    with torch.compiler.config.patch(cache_key_tag="mine"):
        with inductor_decompositions():
            assert torch.compiler.config.cache_key_tag == f"mine:{op_schemas_tag()}"
        assert torch.compiler.config.cache_key_tag == "mine"
    with torch.compiler.config.patch(cache_key_tag=""), inductor_decompositions():
        assert torch.compiler.config.cache_key_tag == op_schemas_tag()
