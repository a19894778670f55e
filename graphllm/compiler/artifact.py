"""The artifact directory: what it holds, its manifest, and the checks made before loading it.

    ART/manifest.json          schema, model config, weight fingerprints, passes, buckets, env
    ART/weights.safetensors    post-pass weights (tied weights stored once, aliases in manifest)
    ART/step.pt2               AOTInductor package of the step (weights kept outside the .so)
    ART/config.json, tokenizer files, generation_config.json, chat_template.jinja
    ART/graphs/                graph before/after passes, per-pass diffs, lowered node table

An artifact is code: the step package is a shared library (or Inductor wrapper) that runs when
loaded. So every file is listed in the manifest with its size and sha256, and loading refuses a
changed, missing or unlisted file with a message that names it (the tokenizer reads whatever
files the folder holds, so an unlisted one changes what the model sees even if it is not code).
Files are written 0644 and directories 0755, whatever mode the writing library chose.
"""

import hashlib
import json
import platform
from pathlib import Path
from typing import Any

import torch

from graphllm.compiler.weights_io import CHUNK_BYTES, chunk_sha256

SCHEMA_VERSION = 3  # 3: files past CHUNK_BYTES hashed per chunk; 2: a sha256 for every file; 1: up to 256 MiB
MANIFEST = "manifest.json"
WEIGHTS = "weights.safetensors"


STEP_PACKAGE = "step.pt2"
FILE_MODE, DIR_MODE = 0o644, 0o755
FINGERPRINT_KEYS = ("torch", "triton", "cuda", "device_name", "capability", "machine", "cpu_isa")
# CPU features Inductor's C++ kernels may be built for (a .so using them crashes without them)
ISA_FLAGS = ("avx2", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_tile", "asimd", "sve")


def rank_weights(rank: int) -> str:
    """The weights file of tensor-parallel rank `rank` (rank 0's, and a one-rank artifact's, is WEIGHTS)."""
    return WEIGHTS if rank == 0 else f"weights.rank{rank}.safetensors"


def weight_files(manifest: dict[str, Any]) -> frozenset[str]:
    """Every rank's weights file the manifest lists: each is checked by the process that loads it, as it
    reads it (loading.load_weights), not twice."""
    return frozenset(name for name in manifest.get("files") or {} if name.startswith("weights")
                     and name.endswith(".safetensors") and "/" not in name)


class ArtifactError(ValueError):
    """An artifact that cannot be loaded; the message says what is wrong and how to recompile."""


def sha256_file(path: Path, chunk: int = 2**20) -> str:
    """One read of the file: about 1.4 GB/s from the page cache on a 2-core x86 VM with SHA-NI
    (hashlib.file_digest, 3.11+ only, measured the same)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def quick_fingerprint(path: Path, sample: int = 2**20) -> str:
    """sha256 of size + first, middle and last MiB: cheap for multi-GB checkpoints, exact for small ones."""
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        for offset in sorted({0, max(0, size // 2 - sample // 2), max(0, size - sample)}):
            f.seek(offset)
            digest.update(f.read(sample))
    return digest.hexdigest()


def cpu_isa_flags() -> list[str]:
    """The ISA_FLAGS this CPU has, read from /proc/cpuinfo (no probe compilation)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    flags = set(next((l.split(":", 1)[1].split() for l in text.splitlines()
                      if l.startswith(("flags", "Features"))), []))
    return [f for f in ISA_FLAGS if f in flags]


def environment_fingerprint(device: torch.device) -> dict[str, Any]:
    """What compiled code depends on: library versions and the device it was built for."""
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    cuda = device.type == "cuda"
    return {
        "torch": torch.__version__,
        "triton": triton_version if cuda else None,
        "cuda": torch.version.cuda if cuda else None,
        "device_name": torch.cuda.get_device_name(device) if cuda else "cpu",
        "capability": list(torch.cuda.get_device_capability(device)) if cuda else None,
        "machine": platform.machine(),
        "cpu_isa": cpu_isa_flags() if not cuda else None,
    }


def artifact_files(art: Path) -> list[str]:
    """Every file under art but the manifest, as sorted relative POSIX paths."""
    return sorted(p.relative_to(art).as_posix() for p in art.rglob("*") if p.is_file() and p != art / MANIFEST)


def file_record(path: Path) -> dict[str, Any]:
    """{"size", "sha256"}, or for a file past CHUNK_BYTES {"size", "chunk_bytes", "chunk_sha256": [...]} (the
    chunks hashed in parallel, and checked as they are read: weights_io.read_safetensors)."""
    size = path.stat().st_size
    if size <= CHUNK_BYTES:
        return {"size": size, "sha256": sha256_file(path)}
    return {"size": size, "chunk_bytes": CHUNK_BYTES, "chunk_sha256": chunk_sha256(path, CHUNK_BYTES)}


def chunk_hashes(record: dict[str, Any]) -> tuple[int, list[str]]:
    """(chunk bytes, sha256 per chunk) of a file record: a whole-file sha256 is one chunk of the file's size."""
    if "chunk_sha256" in record:
        return record["chunk_bytes"], record["chunk_sha256"]
    return max(1, record["size"]), [record["sha256"]]


def file_records(art: Path, known: dict[str, dict[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
    """Every file's record; `known` ones (hashed when they were written) are taken as they are."""
    known = known or {}
    return {name: known.get(name) or file_record(art / name) for name in artifact_files(art)}


def set_permissions(art: Path) -> None:
    """Files 0644 and directories 0755 (safetensors writes its file 0600, mkdir follows the umask)."""
    art.chmod(DIR_MODE)
    for path in art.rglob("*"):
        path.chmod(DIR_MODE if path.is_dir() else FILE_MODE)


def write_manifest(art: Path, manifest: dict[str, Any], known: dict[str, dict[str, Any]] | None = None) -> None:
    manifest = {"schema_version": SCHEMA_VERSION, **manifest, "files": file_records(art, known)}
    (art / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=False))
    set_permissions(art)


def recompile_hint(manifest: dict[str, Any] | None, art: Path) -> str:
    command = (manifest or {}).get("compile_command") or f"graphllm compile --model MODEL_DIR --out {art}"
    return f"Recompile it with: {command}"


def read_manifest(art: Path) -> dict[str, Any]:
    file = art / MANIFEST
    if not art.is_dir():
        raise ArtifactError(f"artifact {art} does not exist or is not a directory. {recompile_hint(None, art)}")
    if not file.is_file():
        raise ArtifactError(f"{art} is not a graphllm artifact: it has no {MANIFEST}. {recompile_hint(None, art)}")
    try:
        manifest = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ArtifactError(f"{file} is damaged (not valid JSON: {e}). {recompile_hint(None, art)}") from e
    manifest = manifest if isinstance(manifest, dict) else {}
    if manifest.get("schema_version") != SCHEMA_VERSION:
        raise ArtifactError(f"{file} has schema version {manifest.get('schema_version')!r}, this graphllm reads "
                            f"{SCHEMA_VERSION} (older artifacts lack a sha256 of every file). "
                            f"{recompile_hint(manifest, art)}")
    return manifest


def listed_files(art: Path, manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The manifest's file records, each with a size and a sha256, or ArtifactError."""
    records = manifest.get("files")
    valid = isinstance(records, dict) and all(
        isinstance(r, dict) and isinstance(r.get("size"), int)
        and (isinstance(r.get("sha256"), str) or isinstance(r.get("chunk_bytes"), int) and r["chunk_bytes"] > 0
             and isinstance(r.get("chunk_sha256"), list) and all(isinstance(h, str) for h in r["chunk_sha256"]))
        and not Path(name).is_absolute() and ".." not in Path(name).parts  # names inside art only
        for name, r in records.items())
    if not valid:
        raise ArtifactError(f"{art / MANIFEST} is damaged (its file list lacks sizes or sha256s, or names a "
                            f"file outside the artifact). {recompile_hint(manifest, art)}")
    return records


def check_files(art: Path, manifest: dict[str, Any], deferred: frozenset[str] = frozenset()) -> None:
    """Every listed file is present with its size and sha256, and no other file is there.

    Sizes first (a stat each), so a truncated or missing file is named before any hashing; then
    each file is read once for its sha256 (per chunk, in parallel, past CHUNK_BYTES), but the `deferred`
    ones: their reader checks each chunk as it loads it (loading.load_weights).
    """
    records = listed_files(art, manifest)
    for name, record in records.items():
        path = art / name
        if not path.is_file():
            raise ArtifactError(f"artifact {art} is missing {name}. {recompile_hint(manifest, art)}")
        if path.stat().st_size != record["size"]:
            raise damaged(art, manifest, name, "size")
    unlisted = [name for name in artifact_files(art) if name not in records]
    if unlisted:
        more = f" (and {len(unlisted) - 1} more)" if len(unlisted) > 1 else ""
        raise ArtifactError(f"artifact {art} holds {unlisted[0]}{more}, which its manifest does not list: an "
                            f"artifact runs as code, so it loads only with the files it was compiled with. "
                            f"Remove the file, or recompile. {recompile_hint(manifest, art)}")
    for name, record in records.items():
        if name in deferred:
            continue
        if "chunk_sha256" in record:
            if chunk_sha256(art / name, record["chunk_bytes"]) != record["chunk_sha256"]:
                raise damaged(art, manifest, name, "sha256")
        elif sha256_file(art / name) != record["sha256"]:
            raise damaged(art, manifest, name, "sha256")


def damaged(art: Path, manifest: dict[str, Any], name: str, what: str) -> ArtifactError:
    return ArtifactError(f"artifact file {name} is damaged or was changed (its {what} differs from the "
                         f"manifest). {recompile_hint(manifest, art)}")


def check_environment(art: Path, manifest: dict[str, Any], device: torch.device) -> None:
    built, here = manifest["environment"], environment_fingerprint(device)
    diffs = [f"{k}: built for {built.get(k)!r}, this machine has {here.get(k)!r}"
             for k in FINGERPRINT_KEYS if built.get(k) != here.get(k)]
    if diffs:
        raise ArtifactError(f"artifact {art} was compiled for another environment ({'; '.join(diffs)}). "
                            f"{recompile_hint(manifest, art)}")


def verify_artifact(art: str | Path, device: torch.device, defer_weights: bool = False) -> dict[str, Any]:
    """The manifest of a loadable artifact, or ArtifactError naming what is wrong. defer_weights: the
    weights files are hashed by the caller's loader as it reads them (weight_files), not here."""
    art = Path(art)
    manifest = read_manifest(art)
    check_files(art, manifest, weight_files(manifest) if defer_weights else frozenset())
    check_environment(art, manifest, device)
    return manifest
