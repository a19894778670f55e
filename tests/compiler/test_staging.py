"""A compile's staging directory and its publish (graphllm.compiler.staging): each compile writes in a directory
of its own, one that died is cleaned up by the next, and racing publishes leave one whole artifact, nothing else.
Real directories and renames, real threads; no compile."""

import os
import socket
import subprocess
import sys
import threading

import pytest

from graphllm.compiler.staging import check_output, owner_alive, publish, remove_abandoned, staging_dir


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def write_artifact(staging, tag: str, files: int = 20):
    for i in range(files):
        (staging / f"f{i}").write_text(tag)
    return staging


def test_two_compiles_of_one_output_get_their_own_staging_directories(tmp_path):
    out = tmp_path / "art"
    a, b = staging_dir(out), staging_dir(out)
    assert a != b and a.parent == b.parent == tmp_path
    assert a.name.startswith("art.partial-") and not any(a.iterdir()) and not out.exists()


def test_owner_alive_reads_host_and_pid():
    host = socket.gethostname()
    assert owner_alive(f"-{host}-{os.getpid()}-0a1b2c3d")
    assert not owner_alive(f"-{host}-{dead_pid()}-0a1b2c3d")
    assert not owner_alive("")  # the fixed OUT.partial name of older compiles
    assert owner_alive(f"-another-host-{dead_pid()}-0a1b2c3d")  # cannot be checked from here
    assert owner_alive("-not-ours")


def test_the_directories_of_dead_compiles_are_removed_and_live_ones_kept(tmp_path):
    out = tmp_path / "art"
    host = socket.gethostname()
    names = {"dead": f"art.partial-{host}-{dead_pid()}-00000000", "legacy": "art.partial",
             "dead_aside": f"art.old-{host}-{dead_pid()}-00000000", "live": f"art.partial-{host}-{os.getpid()}-1",
             "remote": f"art.partial-elsewhere-1-00000000", "other_output": f"art2.partial-{host}-{dead_pid()}-0"}
    for name in names.values():
        (tmp_path / name).mkdir()
        (tmp_path / name / "junk").write_text("half a compile")
    remove_abandoned(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[k] for k in ("live", "remote", "other_output"))


def test_publish_replaces_the_output_and_leaves_nothing_beside_it(tmp_path):
    out = tmp_path / "art"
    publish(write_artifact(staging_dir(out), "first"), out)
    assert {p.read_text() for p in out.iterdir()} == {"first"}
    publish(write_artifact(staging_dir(out), "second", files=3), out)
    assert sorted(p.name for p in out.iterdir()) == ["f0", "f1", "f2"]
    assert {p.read_text() for p in out.iterdir()} == {"second"}
    assert [p.name for p in tmp_path.iterdir()] == ["art"]


@pytest.mark.parametrize("round", range(3))
def test_racing_publishes_leave_one_whole_artifact(tmp_path, round):
    out = tmp_path / "art"
    publish(write_artifact(staging_dir(out), "old"), out)
    stagings = [write_artifact(staging_dir(out), f"compile {i}") for i in range(8)]
    start = threading.Barrier(len(stagings))
    errors = []

    def run(staging):
        start.wait()
        try:
            publish(staging, out)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(s,)) for s in stagings]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert [p.name for p in tmp_path.iterdir()] == ["art"]
    tags = {p.read_text() for p in out.iterdir()}
    assert len(tags) == 1 and tags != {"old"} and len(list(out.iterdir())) == 20


def test_an_output_that_is_not_an_artifact_is_refused_before_anything_is_replaced(tmp_path):
    """Regression (s35's fuzzing): `graphllm compile --out DIR` replaced DIR whole, whatever it held: a folder of
    someone's files, or the model folder being compiled."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    others = tmp_path / "others"
    others.mkdir()
    (others / "thesis.txt").write_text("x")
    a_file = tmp_path / "notes.txt"
    a_file.write_text("x")
    for out, match in ((model, "holds the model folder"), (tmp_path, "holds the model folder"),
                       (others, "directory of other files"), (a_file, "is a file")):
        with pytest.raises(ValueError, match=match):
            check_output(out, model)
    assert (others / "thesis.txt").is_file() and a_file.is_file() and (model / "config.json").is_file()
    empty, artifact = tmp_path / "empty", tmp_path / "art"
    empty.mkdir()
    artifact.mkdir()
    (artifact / "manifest.json").write_text("{}")
    for out in (empty, artifact, tmp_path / "new", model / "art"):  # what a compile may write or replace
        check_output(out, model)
