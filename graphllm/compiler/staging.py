"""Where a compile writes before its artifact exists, and how the artifact replaces what its output held.

Each compile writes into a staging directory of its own beside the output (OUT.partial-HOST-PID-NONCE), so two
compiles of one output (two servers started at once on one model, two `graphllm compile --out` runs) never
write into, or delete, each other's files. The complete directory then takes the output's name by renames
only: out names a whole artifact, the old one or the new one, at every moment except between two renames.
Directories left by a compile whose process is gone (killed half way) are removed by the next compile of the
same output; those of other hosts (a shared file system) are left alone, as their owner cannot be checked.
"""

import contextlib
import errno
import fcntl
import logging
import os
import shutil
import socket
import sys
import uuid
from pathlib import Path

from graphllm.compiler.artifact import MANIFEST

STAGING, ASIDE = ".partial", ".old"
PUBLISH_TRIES = 16

logger = logging.getLogger(__name__)


def owner_suffix() -> str:
    return f"-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def owner_alive(suffix: str) -> bool:
    """Whether the process named by an owner_suffix may still be writing (True when it cannot be told:
    another host's, or a name this module did not make)."""
    if not suffix:
        return False  # OUT.partial: the fixed name of compiles before owners were named
    parts = suffix[1:].rsplit("-", 2)
    if len(parts) != 3 or not parts[1].isdigit() or parts[0] != socket.gethostname():
        return True
    try:
        os.kill(int(parts[1]), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's live process
    return True


def remove_abandoned(out: Path) -> None:
    """The staging and set-aside directories of out's earlier compiles whose process has gone."""
    for kind in (STAGING, ASIDE):
        prefix = out.name + kind
        for path in out.parent.glob(f"{prefix}*"):
            if path.name == prefix or path.name.startswith(prefix + "-"):
                if not owner_alive(path.name[len(prefix):]):
                    shutil.rmtree(path, ignore_errors=True)


def check_output(out: Path, model_dir: Path) -> None:
    """Refuse an output whose publish would destroy what is not an artifact: publish replaces out whole, so out
    must be missing, an empty directory or an artifact (its manifest.json), and must not hold the model being
    compiled (s35's fuzzing: `--out` naming the model folder, or a folder of other files, deleted them)."""
    out, model_dir = out.resolve(), model_dir.resolve()
    if out == model_dir or out in model_dir.parents:
        raise ValueError(f"--out {out} holds the model folder being compiled ({model_dir}): choose an output "
                         "folder outside it")
    if out.is_file() or out.is_symlink() and not out.is_dir():
        raise ValueError(f"--out {out} is a file: an artifact is a directory; choose another output path")
    if out.is_dir() and not (out / MANIFEST).is_file() and any(out.iterdir()):
        raise ValueError(f"--out {out} is a directory of other files (no {MANIFEST}): a compile replaces its output "
                         "whole, so it only writes into a new or empty directory or over an artifact")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"--out {out}: its folder cannot be made ({e.strerror})") from e


def staging_dir(out: Path) -> Path:
    """A new, empty directory of this compile's own beside out."""
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_abandoned(out)
    staging = out.with_name(out.name + STAGING + owner_suffix())
    staging.mkdir()
    return staging


def publish(staging: Path, out: Path) -> None:
    """Rename the complete staging directory to out. What out held is renamed aside first and removed after; a
    compile publishing the same output in between wins the rename, and this one sets its artifact aside in
    turn (the last to publish is what out holds, whole)."""
    aside = out.with_name(out.name + ASIDE + owner_suffix())
    for _ in range(PUBLISH_TRIES):
        shutil.rmtree(aside, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            out.rename(aside)
        try:
            staging.rename(out)
            break
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
    else:
        raise OSError(f"could not rename {staging} to {out}: other compiles kept writing it ({PUBLISH_TRIES} tries)")
    shutil.rmtree(aside, ignore_errors=True)


@contextlib.contextmanager
def exclusive(lock: Path, waiting: str, show_progress: bool):
    """Holds an exclusive flock on the file lock (made if missing) for the block; says `waiting` first when
    another process holds it. The kernel drops the lock with its process, so a killed compile frees it."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if show_progress:
                print(waiting, file=sys.stderr, flush=True)
            logger.info(waiting)
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
