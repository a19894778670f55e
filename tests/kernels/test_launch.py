"""graphllm/kernels/launch.py: programmatic dependent launch is asked for per block (the graph capture), read by the
kernels' launchers, never on the CPU; `--enable-pdl` reaches EngineConfig. (The kernels' PDL variants are
compiled for sm_90 by tests/kernels/sm90_compile.py and run on the GPU by tests/gpu/test_programmatic_launch.py.)"""

import argparse

import torch

from graphllm.cli.args import engine_config
from graphllm.cli.serve import add_serve_parser
from graphllm.config import EngineConfig
from graphllm.kernels import launch


def test_asked_for_inside_the_block_only_and_restored():
    assert not launch._enabled.get()
    with launch.programmatic_launch(True):
        assert launch._enabled.get()
        with launch.programmatic_launch(False):
            assert not launch._enabled.get()
        assert launch._enabled.get()
        assert not launch.launches_dependent(torch.device("cpu"))  # never on the CPU, even when asked for
    assert not launch._enabled.get()


def test_enable_pdl_flag_reaches_the_engine_config():
    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers(dest="command"))
    assert EngineConfig().enable_pdl and engine_config(parser.parse_args(["serve"])).enable_pdl  # the default
    assert not engine_config(parser.parse_args(["serve", "--no-enable-pdl"])).enable_pdl


def test_an_engine_with_pdl_compiles_inductor_kernels_for_it_too():
    """EngineConfig.enable_pdl makes compile=True lower with Inductor's triton.enable_pdl (a CompileConfig field,
    so its own artifact: tests/compiler/test_pipeline.py), which inductor_options adds where this torch has it."""
    from graphllm.compiler.inductor_lowering import inductor_options
    assert EngineConfig(model="m").compile_config().inductor_pdl
    assert not EngineConfig(model="m", enable_pdl=False).compile_config().inductor_pdl
    assert inductor_options(False) == {"emulate_precision_casts": True}
    has_option = hasattr(torch._inductor.config.triton, "enable_pdl")
    assert inductor_options(True).get("triton.enable_pdl", False) == has_option
