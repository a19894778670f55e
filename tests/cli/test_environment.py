"""The CLI entry is the one place the environment is read; what it reads reaches the configs as fields."""

import argparse

from graphllm.cli.args import add_engine_args, compile_config, engine_config
from graphllm.cli.environment import Environment
from graphllm.cli.main import build_parser


def test_environment_is_read_into_fields():
    env = Environment.read({"GRAPHLLM_CACHE_DIR": "/c", "GRAPHLLM_API_KEY": "k", "UNRELATED": "x"})
    assert env == Environment(cache_dir="/c", api_key="k")
    assert Environment.read({"GRAPHLLM_CACHE_DIR": ""}) == Environment()  # empty means unset


def test_cache_dir_and_api_key_reach_the_configs():
    args = build_parser(Environment(cache_dir="/c", api_key="k")).parse_args(["serve", "--eager"])
    assert args.api_key == "k"
    config = engine_config(args)
    assert config.cache_dir == "/c" and str(config.artifact_cache) == "/c/artifacts"
    args = build_parser(Environment()).parse_args(["generate", "--prompt", "hi"])
    assert engine_config(args).cache_dir is None and not hasattr(args, "api_key")


def test_pass_switches_are_flags_of_the_compile_config():
    """What were GRAPHLLM_FUSED_ROPE / GRAPHLLM_SKINNY_MATMUL / GRAPHLLM_FUSED_PROLOGUE are flags now."""
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    parser.add_argument("--buckets", type=int, nargs="+")
    default = parser.parse_args([])
    assert (default.fuse_rope_attention, default.skinny_linear, default.linear_prologue) == (True, True, True)
    for config in (compile_config(default), engine_config(default).compile_config()):
        assert (config.fuse_rope_attention, config.skinny_linear, config.linear_prologue) == (True, True, True)
    args = parser.parse_args(["--no-fuse-rope-attention", "--no-skinny-linear", "--no-linear-prologue", "-tp", "2"])
    for config in (compile_config(args), engine_config(args).compile_config()):
        assert (config.fuse_rope_attention, config.skinny_linear, config.linear_prologue) == (False, False, False)
        assert config.tensor_parallel_size == 2  # the ranks' weights are baked in


def test_enable_pdl_reaches_the_compile_config_of_compile_and_of_the_engine():
    """`graphllm compile` and an engine build Inductor's kernels for PDL (inductor_pdl) unless --no-enable-pdl."""
    parser = build_parser(Environment())
    assert compile_config(parser.parse_args(["compile", "--out", "a"])).inductor_pdl
    assert not compile_config(parser.parse_args(["compile", "--out", "a", "--no-enable-pdl"])).inductor_pdl
    engine = engine_config(parser.parse_args(["serve"]))
    assert engine.enable_pdl and engine.compile_config().inductor_pdl
    engine = engine_config(parser.parse_args(["serve", "--no-enable-pdl"]))
    assert not engine.enable_pdl and not engine.compile_config().inductor_pdl


def test_no_module_below_the_cli_reads_the_environment():
    """Only graphllm/cli/environment.py names os.environ / os.getenv (ast walk of the package)."""
    import ast
    from pathlib import Path
    package = Path(__file__).resolve().parents[2] / "graphllm"
    readers = []
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv"):
                readers.append(path.relative_to(package).as_posix())
    assert sorted(set(readers)) == ["bench/compile_bench.py", "cli/environment.py"]
