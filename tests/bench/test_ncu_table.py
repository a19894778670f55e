"""benchmarks/ncu_table.py turns Nsight Compute's CSV into one line per launch, named in launch order."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import ncu_table  # noqa: E402

HEADER = '"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"\n'


def row(launch: int, name: str, unit: str, value: str) -> str:
    return f'"{launch}","_decode_split_kernel","{name}","{unit}","{value}"\n'


def test_table_names_launches_in_order_and_converts_units(tmp_path, capsys):
    csv = tmp_path / "ncu.csv"
    csv.write_text("==PROF== a log line ncu mixes in\n" + HEADER
                   + row(1, "gpu__time_duration.sum", "usecond", "245.5")
                   + row(1, "dram__bytes_read.sum", "Mbyte", "537")
                   + row(1, "launch__occupancy_limit_shared_mem", "block", "2")
                   + row(1, "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio", "", "3.5")
                   + row(1, "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio", "", "1.25")
                   + row(0, "gpu__time_duration.sum", "nsecond", "1,500"))
    ncu_table.table(str(csv), ["first", "second"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("first | _decode_split_kernel | 1.5 |")
    second = lines[2]
    assert second.startswith("second | _decode_split_kernel | 245.5 |") and "| 0.5370 |" in second
    assert "-1, 2 |" in second  # blocks per SM: by registers (not given), by shared memory
    assert "| barrier 3.50, long_scoreboard 1.25, " in second  # the stalls, largest first
