"""The README's Python example runs as written on the demo model (eager, so no compile), so that
it cannot drift from the API again (it once passed token id 15043 to a 398-token vocabulary)."""

import asyncio
import re
import textwrap
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def python_example() -> tuple[str, str]:
    """The README's first ```python block, split into its plain code and its `async for` tail,
    which needs an event loop."""
    block = re.search(r"^```python\n(.*?)^```", README.read_text(), re.S | re.M).group(1)
    plain, found, tail = block.partition("async for ")
    assert found, "the example no longer streams: update this test"
    return plain, found + tail


def test_readme_python_example_runs_on_the_demo_model(capsys):
    plain, streaming = python_example()
    scope = {}
    exec(compile(plain, "README.md", "exec"), scope)
    exec(compile("async def stream_example():\n" + textwrap.indent(streaming, "    "), "README.md", "exec"), scope)
    asyncio.run(scope["stream_example"]())
    outs = scope["outs"]
    assert len(outs) == 2 and all(o.outputs[0].finish_reason in ("stop", "length") for o in outs)
    assert scope["engine"].config.model is None  # the demo model: no path to a folder of one's own
    assert outs[0].outputs[0].text in capsys.readouterr().out
