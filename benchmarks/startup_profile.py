"""Where compile and start-up time go: cProfile of `compile_model` and of `Engine.load` (issue 19).

    python benchmarks/startup_profile.py MODEL_DIR WORK_DIR OUT.json [TOP]

Compiles MODEL_DIR into WORK_DIR/artifact in this process under cProfile (a fresh Inductor cache is the
caller's business: set TORCHINDUCTOR_CACHE_DIR), then loads it in a fresh interpreter under cProfile and
generates one token. Prints, for each, the compile phases or the start-up phases and the TOP (default 30)
functions by cumulative and by own time; writes them to OUT.json.
"""

import cProfile
import io
import json
import pstats
import subprocess
import sys
import time
from pathlib import Path

LOAD = """
import cProfile, io, json, pstats, sys, time
start = time.time()
profiler = cProfile.Profile()
profiler.enable()
from graphllm import Engine, SamplingParams
engine = Engine.load(sys.argv[1])
engine.generate([[1] * 16], SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
profiler.disable()
out = {}
for key in ("cumulative", "tottime"):
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats(key).print_stats(int(sys.argv[2]))
    out[key] = text.getvalue()
print(json.dumps({"seconds": time.time() - start, "startup": engine.state.startup_seconds, **out}))
"""


def top(profiler: cProfile.Profile, key: str, count: int) -> str:
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats(key).print_stats(count)
    return text.getvalue()


def main(model: str, work: str, out: str, count: int = 30) -> None:
    from graphllm.compiler.pipeline import compile_model
    from graphllm.config import CompileConfig
    art = Path(work) / "artifact"
    profiler = cProfile.Profile()
    start = time.time()
    profiler.enable()
    manifest = compile_model(model, art, CompileConfig(max_num_seqs=256), show_progress=False)
    profiler.disable()
    report = {"compile": {"seconds": time.time() - start, "phases": manifest["timings"],
                          "cumulative": top(profiler, "cumulative", count), "tottime": top(profiler, "tottime", count)}}
    print(f"compile: {report['compile']['seconds']:.1f} s, phases {manifest['timings']}", flush=True)
    result = subprocess.run([sys.executable, "-c", LOAD, str(art), str(count)], capture_output=True, text=True)
    if result.returncode:
        raise RuntimeError(result.stderr[-4000:])
    report["load"] = json.loads(result.stdout.strip().splitlines()[-1])
    print(f"load + one token: {report['load']['seconds']:.1f} s, phases {report['load']['startup']}", flush=True)
    Path(out).write_text(json.dumps(report, indent=1))
    for what in ("compile", "load"):
        for key in ("cumulative", "tottime"):
            print(f"==== {what}, by {key}\n" + "\n".join(report[what][key].splitlines()[:count + 12]))


if __name__ == "__main__":
    main(*sys.argv[1:4], *map(int, sys.argv[4:5]))
