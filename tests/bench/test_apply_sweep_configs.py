"""benchmarks/apply_sweep_configs.py rewrites a kernel module's CONFIGS from a sweep's JSON."""

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import apply_sweep_configs  # noqa: E402

SOURCE = '''"""doc"""
CONFIGS: dict[tuple[int, int, int], dict] = {
    (1, 64, 32): {'BLOCK_M': 1, 'BLOCK_N': 32},
    (16, 64, 32): {'BLOCK_M': 16, 'BLOCK_N': 64},  # a comment kept
}
OTHER = 1
'''


def test_measured_entries_replace_and_others_stay():
    report = {"rows": [
        {"kernel": "int4", "m": 1, "n": 64, "k": 32, "best_config": {"BLOCK_M": 1, "BLOCK_N": 128, "ROW_SUM": True}},
        {"kernel": "int4", "m": 3, "n": 8, "k": 16, "best_config": {"BLOCK_M": 16}},  # bucket 4, a new key
        {"kernel": "fp8", "m": 16, "n": 64, "k": 32, "best_config": {"BLOCK_M": 99}},  # another kernel's
        {"kernel": "int4", "m": 16, "n": 64, "k": 32},  # nothing measured: the entry stays
    ]}
    current = {(1, 64, 32): {"BLOCK_M": 1, "BLOCK_N": 32}, (16, 64, 32): {"BLOCK_M": 16, "BLOCK_N": 64}}
    configs = apply_sweep_configs.merged_configs(report, "int4", current)
    out = apply_sweep_configs.rewrite(SOURCE, configs)
    tree = ast.parse(out)
    literal = ast.literal_eval(tree.body[1].value)
    assert literal == {(1, 64, 32): {"BLOCK_M": 1, "BLOCK_N": 128, "ROW_SUM": True}, (4, 8, 16): {"BLOCK_M": 16},
                       (16, 64, 32): {"BLOCK_M": 16, "BLOCK_N": 64}}
    assert "{'BLOCK_M': 16, 'BLOCK_N': 64},  # a comment kept\n" in out
    assert out.startswith('"""doc"""\n') and out.endswith("}\nOTHER = 1\n")


def test_a_module_without_the_block_is_refused():
    try:
        apply_sweep_configs.rewrite("X = 1\n", {})
    except ValueError as exc:
        assert "CONFIGS" in str(exc)
    else:
        raise AssertionError("rewrite accepted a source without CONFIGS")
