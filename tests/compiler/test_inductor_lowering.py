"""lower_inductor's shallow operator messages: Inductor's log line for an op it meets first names its arguments
by buffer and size, not by the text of every op before them (which doubles per layer where an op reads two
outputs of the one before: torch 2.11 formatted it eagerly and the 8B row_sumsq compile never finished)."""

import logging

import torch
from torch._inductor.utils import fresh_inductor_cache

from graphllm.compiler.inductor_lowering import lower_inductor

DEPTH = 12  # each op reads both outputs of the one before: the unbounded text has 2**DEPTH copies of the first


@torch.library.custom_op("graphllm_test::pair", mutates_args=())
def pair(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return a + b, a * b


@pair.register_fake
def _(a, b):
    return torch.empty_like(a), torch.empty_like(a)


@torch.library.custom_op("graphllm_test::last", mutates_args=())
def last(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a - b


@last.register_fake
def _(a, b):
    return torch.empty_like(a)


class Chain(torch.nn.Module):
    def forward(self, x, y):
        for _ in range(DEPTH):
            x, y = pair(x, y)
        return last(x, y)


class Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def test_the_implicit_fallback_line_names_the_arguments_only(tmp_path):
    x, y = torch.rand(4), torch.rand(4)
    exported = torch.export.export(Chain(), (x, y))
    graph_log = logging.getLogger("torch._inductor.graph")
    handler, level = Lines(), graph_log.level
    graph_log.addHandler(handler)
    graph_log.setLevel(logging.INFO)
    try:
        with fresh_inductor_cache():  # a cached graph would skip the lowering and its log line
            lower_inductor(exported, tmp_path / "step.inductor")
    finally:
        graph_log.removeHandler(handler)
        graph_log.setLevel(level)
    lines = [line for line in handler.lines if "implicit fallback" in line and "graphllm_test.last" in line]
    assert len(lines) == 1, handler.lines
    assert "args[0]: " in lines[0] and "size=[4]" in lines[0] and len(lines[0]) < 500, lines[0]
    loaded = torch._inductor.CompiledArtifact.load(path=str(tmp_path / "step.inductor"), format="binary")
    assert torch.equal(loaded(x, y)[0], Chain()(x, y))


class _Features:
    """What InductorChoices.should_use_persistent_reduction reads of a kernel's features."""

    def __init__(self, hint, numel: int):
        import sympy
        self.hint, self.reduction_numel, self.numel = hint, sympy.Integer(numel), sympy.Integer(4096)

    def get_reduction_hint(self):
        return self.hint


def test_persistent_rows_takes_rows_up_to_its_limit():
    """persistent_choices: inner reductions up to PERSISTENT_ROW_NUMEL wide become persistent (Inductor's own
    limit is 1,024: a 4,096-wide norm row was looped), wider rows and other reductions stay Inductor's, and
    persistent_rows installs it with its tag in Inductor's cache keys only while it is entered."""
    from torch._inductor.choices import InductorChoices
    from torch._inductor.runtime.hints import ReductionHint
    from torch._inductor.sizevars import SizeVarAllocator
    from torch._inductor.virtualized import V

    from graphllm.compiler.inductor_lowering import PERSISTENT_ROW_NUMEL, persistent_choices, persistent_rows

    class Graph:  # the sizevars a decision asks
        sizevars = SizeVarAllocator()

    ours, theirs = persistent_choices(), InductorChoices()
    with V.set_graph_handler(Graph()):
        row = _Features(ReductionHint.INNER, 4096)
        assert not theirs.should_use_persistent_reduction(row, False)
        assert ours.should_use_persistent_reduction(row, False)
        assert ours.should_use_persistent_reduction(_Features(ReductionHint.INNER, PERSISTENT_ROW_NUMEL), False)
        assert not ours.should_use_persistent_reduction(_Features(ReductionHint.INNER, 2 * PERSISTENT_ROW_NUMEL), False)
        assert not ours.should_use_persistent_reduction(row, True)  # cooperative: Inductor's decision
        outer = _Features(ReductionHint.OUTER, 4096)
        assert ours.should_use_persistent_reduction(outer, False) == theirs.should_use_persistent_reduction(outer, False)
    tag = torch.compiler.config.cache_key_tag
    with persistent_rows():
        assert type(V.choices).__name__ == "PersistentRows"
        assert f"persistent-rows-{PERSISTENT_ROW_NUMEL}" in torch.compiler.config.cache_key_tag
    assert type(V.choices).__name__ != "PersistentRows" and torch.compiler.config.cache_key_tag == tag
