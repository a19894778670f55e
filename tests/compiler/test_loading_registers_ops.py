"""A fresh process that only loads artifacts has every graphllm op a compiled step may call.

GPU artifacts call graphllm.linear (the skinny_linear pass), and every artifact calls the
attention op and the fused ops; loading must not depend on the compiler having been imported.
"""

import subprocess
import sys

import torch

import graphllm.ops.attention  # noqa: F401
import graphllm.ops.linear  # noqa: F401
import graphllm.ops.moe  # noqa: F401
import graphllm.ops.rms_norm  # noqa: F401
import graphllm.ops.silu_and_mul  # noqa: F401


def test_loading_module_registers_every_graphllm_op():
    ops = sorted(name for name in dir(torch.ops.graphllm) if not name.startswith("_")
                 and isinstance(getattr(torch.ops.graphllm, name), torch._ops.OpOverloadPacket))
    assert {"attention", "linear", "rms_norm", "add_rms_norm", "silu_and_mul", "fused_moe"} <= set(ops)
    code = ("import torch, graphllm.compiler.loading; "
            f"missing = [n for n in {ops!r} if not hasattr(torch.ops.graphllm, n)]; "
            "assert not missing, missing")
    subprocess.run([sys.executable, "-c", code], check=True)
