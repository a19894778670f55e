"""The artifact's weights files, written and read in parallel, in the safetensors format.

    [8 bytes: header length N, little-endian][N bytes: JSON header, space-padded to 8][tensor bytes]

The header maps each name to {"dtype", "shape", "data_offsets": [begin, end)} within the data; tensors are
laid out widest element first, then by name (every one aligned to its element size, no holes), as the
safetensors library does, so its `safe_open` reads what `write_safetensors` writes and `read_safetensors`
reads what `save_file` writes (tests/compiler/test_weights_io.py).

Why not the library: loading is the largest part of start-up. `read_safetensors` reads the file in
CHUNK_BYTES pieces on a thread pool (`os.preadv` into pinned host buffers, each thread with two of them and
its own CUDA stream), checks each piece's sha256 against the manifest as it goes, and copies it into the
tensors with asynchronous host-to-device copies: one pass over the bytes, in parallel, where the library's
`safe_open(device="cuda")` reads tensor by tensor and the manifest check hashed the whole file serially
first. `chunk_sha256` hashes the same pieces in parallel when the artifact is written. Reading, hashing
and copying all release the GIL.
"""

import contextlib
import hashlib
import json
import os
import struct
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

CHUNK_BYTES = 16 * 2**20  # a file of more bytes is hashed per piece (the manifest's chunk_sha256)
DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
          torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
          torch.bool: "BOOL", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2"}
DTYPE_NAMES = {name: dtype for dtype, name in DTYPES.items()}


class ChunkMismatch(ValueError):
    """A piece of a file whose sha256 is not the manifest's."""

    def __init__(self, path: Path, begin: int, end: int):
        super().__init__(f"{path}: the sha256 of bytes {begin}..{end} differs from the manifest")
        self.begin, self.end = begin, end


def io_workers() -> int:
    return max(1, min(16, os.cpu_count() or 1))


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of a contiguous tensor's memory."""
    return tensor.reshape(-1).view(torch.uint8)


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while data:
        written = os.pwrite(fd, data, offset)
        data, offset = data[written:], offset + written


def _pread_all(fd: int, buffer: memoryview, offset: int) -> None:
    while buffer:
        got = os.preadv(fd, [buffer], offset)
        if got == 0:
            raise ValueError(f"file ends before byte {offset}")
        buffer, offset = buffer[got:], offset + got


def header_bytes(tensors: dict[str, torch.Tensor]) -> tuple[bytes, list[tuple[str, int]]]:
    """(8-byte length + padded JSON header, [(name, data offset)]) in the file's tensor order."""
    order = sorted(tensors, key=lambda n: (-tensors[n].element_size(), n))
    header, layout, offset = {}, [], 0
    for name in order:
        t = tensors[name]
        if t.dtype not in DTYPES:
            raise ValueError(f"tensor {name} has dtype {t.dtype}, which the safetensors format cannot store")
        nbytes = t.numel() * t.element_size()
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + nbytes]}
        layout.append((name, offset))
        offset += nbytes
    header["__metadata__"] = {"format": "pt"}
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    return struct.pack("<Q", len(blob)) + blob, layout


def write_safetensors(tensors: dict[str, torch.Tensor], path: Path, workers: int | None = None) -> None:
    """Write tensors (on any device) to path; each tensor is copied to the host and written by a pool thread."""
    prefix, layout = header_bytes(tensors)
    with open(path, "wb") as f:
        f.write(prefix)
        f.truncate(len(prefix) + sum(t.numel() * t.element_size() for t in tensors.values()))
    fd = os.open(path, os.O_WRONLY)
    try:
        def write_one(item: tuple[str, int]) -> None:
            name, offset = item
            host = _as_bytes(tensors[name].detach().contiguous()).cpu()
            if host.numel():
                _pwrite_all(fd, memoryview(host.numpy()), len(prefix) + offset)

        with ThreadPoolExecutor(workers or io_workers()) as pool:
            list(pool.map(write_one, layout))
    finally:
        os.close(fd)


def chunk_spans(size: int, chunk_bytes: int) -> list[tuple[int, int]]:
    return [(begin, min(size, begin + chunk_bytes)) for begin in range(0, size, chunk_bytes)] or [(0, 0)]


def chunk_sha256(path: Path, chunk_bytes: int = CHUNK_BYTES, workers: int | None = None) -> list[str]:
    """The sha256 of each chunk_bytes piece of the file, hashed in parallel."""
    fd = os.open(path, os.O_RDONLY)
    try:
        def digest(span: tuple[int, int]) -> str:
            buffer = bytearray(span[1] - span[0])
            _pread_all(fd, memoryview(buffer), span[0])
            return hashlib.sha256(buffer).hexdigest()

        with ThreadPoolExecutor(workers or io_workers()) as pool:
            return list(pool.map(digest, chunk_spans(os.fstat(fd).st_size, chunk_bytes)))
    finally:
        os.close(fd)


def read_header(path: Path, chunk_hashes: list[str] | None = None,
                chunk_bytes: int = CHUNK_BYTES) -> tuple[dict, int]:
    """(header without __metadata__, data start) or ValueError naming what is wrong; with chunk_hashes the
    chunks holding the header are checked before it is parsed (ChunkMismatch)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        raw = f.read(8)
        if len(raw) < 8:
            raise ValueError("shorter than a safetensors header")
        length = struct.unpack("<Q", raw)[0]
        if length > min(size - 8, 100 * 2**20):
            raise ValueError(f"header length {length} is past the end of the file")
        for index, (begin, end) in enumerate(chunk_spans(size, chunk_bytes)):
            if chunk_hashes is None or begin >= 8 + length:
                break
            f.seek(begin)
            if index >= len(chunk_hashes) or hashlib.sha256(f.read(end - begin)).hexdigest() != chunk_hashes[index]:
                raise ChunkMismatch(path, begin, end)
        f.seek(8)
        header = json.loads(f.read(length))
    header.pop("__metadata__", None)
    return header, 8 + length


class _Staging(threading.local):
    """A pool thread's two host buffers (pinned on CUDA), its copy stream, and the copy each buffer waits on."""

    def setup(self, nbytes: int, device: torch.device) -> None:
        if getattr(self, "buffers", None) is not None:
            return
        pinned = device.type == "cuda"
        self.buffers = [torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned) for _ in range(2)]
        self.events = [None, None]
        self.stream = torch.cuda.Stream(device) if pinned else None
        self.turn = 0

    def next_buffer(self) -> tuple[int, torch.Tensor]:
        self.turn ^= 1
        if self.events[self.turn] is not None:
            self.events[self.turn].synchronize()  # its last copy to the device is done
        return self.turn, self.buffers[self.turn]


def _pieces(tensors: list[tuple[int, int, torch.Tensor]], spans: list[tuple[int, int]], chunk_bytes: int):
    """Per chunk, the (tensor bytes, offset in the tensor, offset in the chunk, length) it holds."""
    pieces: list[list] = [[] for _ in spans]
    for begin, end, tensor in tensors:
        flat, at = _as_bytes(tensor), begin
        while at < end:
            chunk = at // chunk_bytes
            stop = min(end, spans[chunk][1])
            pieces[chunk].append((flat, at - begin, at - spans[chunk][0], stop - at))
            at = stop
    return pieces


def read_safetensors(path: Path, device: torch.device, chunk_hashes: list[str] | None = None,
                     chunk_bytes: int = CHUNK_BYTES, workers: int | None = None) -> dict[str, torch.Tensor]:
    """Every tensor of the file on device. chunk_hashes: the sha256 of each chunk_bytes piece (one for a file
    of at most chunk_bytes: its whole sha256), checked as the piece is read (ChunkMismatch); ValueError for a
    file that is not safetensors."""
    header, data_start = read_header(path, chunk_hashes, chunk_bytes)
    size = os.path.getsize(path)
    out, placed = {}, []
    for name, info in header.items():
        dtype, shape, (begin, end) = DTYPE_NAMES[info["dtype"]], info["shape"], info["data_offsets"]
        tensor = torch.empty(shape, dtype=dtype, device=device)
        if end - begin != tensor.numel() * tensor.element_size() or data_start + end > size:
            raise ValueError(f"tensor {name}'s data_offsets {begin}..{end} do not hold {info['dtype']}{shape}")
        out[name] = tensor
        if end > begin:
            placed.append((data_start + begin, data_start + end, tensor))
    spans = chunk_spans(size, chunk_bytes)
    if chunk_hashes is not None and len(chunk_hashes) != len(spans):
        raise ChunkMismatch(path, 0, size)
    pieces = _pieces(placed, spans, chunk_bytes)
    staging = _Staging()
    fd = os.open(path, os.O_RDONLY)
    try:
        def load(index: int) -> None:
            staging.setup(min(chunk_bytes, size), device)
            (begin, end), (turn, buffer) = spans[index], staging.next_buffer()
            view = memoryview(buffer.numpy())[:end - begin]
            _pread_all(fd, view, begin)
            if chunk_hashes is not None and hashlib.sha256(view).hexdigest() != chunk_hashes[index]:
                raise ChunkMismatch(path, begin, end)
            with torch.cuda.stream(staging.stream) if staging.stream is not None else contextlib.nullcontext():
                for flat, at, offset, length in pieces[index]:
                    flat[at:at + length].copy_(buffer[offset:offset + length], non_blocking=True)
                if staging.stream is not None:
                    staging.events[turn] = staging.stream.record_event()

        with ThreadPoolExecutor(workers or io_workers()) as pool:
            list(pool.map(load, range(len(spans))))
    finally:
        os.close(fd)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return out

