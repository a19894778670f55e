"""weights_io writes what the safetensors library reads and reads what it writes, chunk hashes included."""

import hashlib

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from graphllm.compiler.weights_io import ChunkMismatch, chunk_sha256, read_safetensors, write_safetensors


def sample_tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "embed": torch.randn(37, 12, generator=g).to(torch.bfloat16),
        "layers.0.w": torch.randn(5, 7, generator=g),
        "layers.0.q": torch.randint(-2**31, 2**31 - 1, (3, 9), dtype=torch.int32, generator=g),
        "fp8": torch.randn(4, 6, generator=g).to(torch.float8_e4m3fn),
        "half": torch.randn(11, generator=g).half(),
        "mask": torch.tensor([True, False, True]),
        "bytes": torch.randint(0, 255, (13,), dtype=torch.uint8, generator=g),
        "scalar": torch.tensor(2.5, dtype=torch.float64),
        "empty": torch.empty(0, 4),
        "transposed": torch.randn(6, 4, generator=g).t(),  # not contiguous: written as its values
    }


def assert_same(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape, name
        assert torch.equal(got[name].view(torch.uint8) if tensor.dtype == torch.float8_e4m3fn else got[name],
                           tensor.view(torch.uint8) if tensor.dtype == torch.float8_e4m3fn else tensor), name


def test_the_library_reads_what_we_write(tmp_path):
    tensors = sample_tensors()
    write_safetensors(tensors, tmp_path / "w.safetensors", workers=3)
    with safe_open(tmp_path / "w.safetensors", framework="pt") as f:
        assert_same({name: f.get_tensor(name) for name in f.keys()}, tensors)


@pytest.mark.parametrize("chunk_bytes", [7, 64, 1000, 2**20])  # pieces that cut tensors, and one whole file
def test_we_read_what_the_library_writes_checking_every_chunk(tmp_path, chunk_bytes):
    tensors = sample_tensors()
    path = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
    hashes = chunk_sha256(path, chunk_bytes, workers=2)
    data = path.read_bytes()
    assert hashes == [hashlib.sha256(data[i:i + chunk_bytes]).hexdigest() for i in range(0, len(data), chunk_bytes)]
    assert_same(read_safetensors(path, torch.device("cpu"), hashes, chunk_bytes, workers=3), tensors)


def test_a_changed_byte_is_named_by_its_chunk(tmp_path):
    path = tmp_path / "w.safetensors"
    write_safetensors(sample_tensors(), path)
    hashes = chunk_sha256(path, 100)
    original = path.read_bytes()
    for at in (250, len(original) - 50):  # in the header (checked before it is parsed), in the tensors
        data = bytearray(original)
        data[at] ^= 1
        path.write_bytes(bytes(data))
        begin = at // 100 * 100
        with pytest.raises(ChunkMismatch, match=f"bytes {begin}..{min(begin + 100, len(data))} differs"):
            read_safetensors(path, torch.device("cpu"), hashes, 100)
    with pytest.raises(ChunkMismatch):  # a manifest with another number of chunks
        read_safetensors(path, torch.device("cpu"), hashes[:-1], 100)


def test_a_file_that_is_not_safetensors_is_a_value_error(tmp_path):
    path = tmp_path / "w.safetensors"
    path.write_bytes(b"\xff" * 16)
    with pytest.raises(ValueError, match="past the end"):
        read_safetensors(path, torch.device("cpu"))
    path.write_bytes(b"\x00")
    with pytest.raises(ValueError, match="shorter than"):
        read_safetensors(path, torch.device("cpu"))
