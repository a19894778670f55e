"""The artifact directory: what it holds, its manifest, and the checks made before loading it.

    ART/manifest.json          schema, model config, weight fingerprints, passes, buckets, env
    ART/weights.safetensors    post-pass weights (tied weights stored once, aliases in manifest)
    ART/step.pt2               AOTInductor package of the step (weights kept outside the .so)
    ART/config.json, tokenizer files, generation_config.json, chat_template.jinja
    ART/graphs/                graph before/after passes, per-pass diffs, lowered node table

Every file is listed in the manifest with its size; files up to HASHED_MAX_BYTES also with
their sha256, so a damaged or truncated file is refused with a message that names it.
"""

import hashlib
import json
import platform
from pathlib import Path
from typing import Any

import torch

SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
WEIGHTS = "weights.safetensors"
STEP_PACKAGE = "step.pt2"
HASHED_MAX_BYTES = 256 * 2**20  # larger files (the weights) are checked by size and header
FINGERPRINT_KEYS = ("torch", "triton", "cuda", "device_name", "capability", "machine", "cpu_isa")
# CPU features Inductor's C++ kernels may be built for (a .so using them crashes without them)
ISA_FLAGS = ("avx2", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_tile", "asimd", "sve")


class ArtifactError(ValueError):
    """An artifact that cannot be loaded; the message says what is wrong and how to recompile."""


def sha256_file(path: Path, chunk: int = 2**22) -> str:
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


def file_records(art: Path) -> dict[str, dict[str, Any]]:
    records = {}
    for path in sorted(p for p in art.rglob("*") if p.is_file() and p.name != MANIFEST):
        size = path.stat().st_size
        record = {"size": size}
        if size <= HASHED_MAX_BYTES:
            record["sha256"] = sha256_file(path)
        records[path.relative_to(art).as_posix()] = record
    return records


def write_manifest(art: Path, manifest: dict[str, Any]) -> None:
    manifest = {"schema_version": SCHEMA_VERSION, **manifest, "files": file_records(art)}
    (art / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=False))


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
    if not isinstance(manifest, dict) or manifest.get("schema_version") != SCHEMA_VERSION:
        found = manifest.get("schema_version") if isinstance(manifest, dict) else None
        raise ArtifactError(f"{file} has schema version {found!r}, this graphllm reads {SCHEMA_VERSION}. "
                            f"{recompile_hint(None, art)}")
    return manifest


def check_files(art: Path, manifest: dict[str, Any]) -> None:
    """Every listed file is present with its size and, where recorded, its sha256."""
    for name, record in manifest["files"].items():
        path = art / name
        if not path.is_file():
            raise ArtifactError(f"artifact {art} is missing {name}. {recompile_hint(manifest, art)}")
        if path.stat().st_size != record["size"] or ("sha256" in record and sha256_file(path) != record["sha256"]):
            raise ArtifactError(f"artifact file {name} is damaged (its size or sha256 differs from the "
                                f"manifest). {recompile_hint(manifest, art)}")


def check_environment(art: Path, manifest: dict[str, Any], device: torch.device) -> None:
    built, here = manifest["environment"], environment_fingerprint(device)
    diffs = [f"{k}: built for {built.get(k)!r}, this machine has {here.get(k)!r}"
             for k in FINGERPRINT_KEYS if built.get(k) != here.get(k)]
    if diffs:
        raise ArtifactError(f"artifact {art} was compiled for another environment ({'; '.join(diffs)}). "
                            f"{recompile_hint(manifest, art)}")


def verify_artifact(art: str | Path, device: torch.device) -> dict[str, Any]:
    """The manifest of a loadable artifact, or ArtifactError naming what is wrong."""
    art = Path(art)
    manifest = read_manifest(art)
    check_files(art, manifest)
    check_environment(art, manifest, device)
    return manifest
