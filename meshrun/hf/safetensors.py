"""The safetensors format, read a slice at a time and written a tensor at a time, with numpy (and
ml_dtypes for bfloat16, which safetensors' own numpy API cannot give).

A file is an 8-byte little-endian header length, a JSON header {name: {dtype, shape,
data_offsets: [begin, end]}, "__metadata__": {...}} and the tensors' bytes, row-major. Reading maps
the file (`numpy.memmap`), so a slice touches only the pages it covers.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HEADER_LIMIT = 100 << 20  # the format's own bound on a header's length
DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}
CODES = {name: code for code, name in DTYPES.items()}


class FormatError(ValueError):
    """A file that is not valid safetensors (the message says what is wrong)."""


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor lies: its file, dtype name (numpy's: float32, bfloat16, ...), shape and the
    byte offset of its data in the file."""

    file: Path
    dtype: str
    shape: tuple[int, ...]
    offset: int

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * numpy_dtype(self.dtype).itemsize


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype of a dtype name (bfloat16 from ml_dtypes)."""
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def read_header(file: Path) -> tuple[dict[str, TensorEntry], dict]:
    """The tensors of a safetensors file by name, and its metadata; FormatError if it is not one."""
    with open(file, "rb") as stream:
        head = stream.read(8)
        if len(head) < 8:
            raise FormatError("shorter than the 8-byte header length")
        (length,) = struct.unpack("<Q", head)
        if length > HEADER_LIMIT:
            raise FormatError(f"header length {length} is beyond the format's limit")
        try:
            header = json.loads(stream.read(length))
        except ValueError as error:
            raise FormatError(f"header is not JSON ({error})") from None
    size = file.stat().st_size
    data_start = 8 + length
    metadata = header.pop("__metadata__", None) or {}
    entries = {}
    for name, info in header.items():
        code = info.get("dtype")
        if code not in DTYPES:
            raise FormatError(f"tensor {name!r} has dtype {code!r}, which meshrun does not read")
        begin, end = info["data_offsets"]
        entry = TensorEntry(file, DTYPES[code], tuple(int(n) for n in info["shape"]), data_start + begin)
        if end - begin != entry.nbytes or data_start + end > size:
            raise FormatError(f"tensor {name!r}'s bytes do not match its shape or lie past the file's end")
        entries[name] = entry
    return entries, metadata


class SliceReader:
    """Reads slices of tensors (`read(entry, index)`) through memory maps kept open per file, and
    counts the bytes it hands out (`bytes_read`)."""

    def __init__(self):
        self._maps: dict[Path, np.memmap] = {}
        self.bytes_read = 0

    def read(self, entry: TensorEntry, index: tuple[slice, ...]) -> np.ndarray:
        """`entry[index]` (basic slices, one per dimension or fewer) as a view of the mapped file:
        the pages are read when the caller copies it out (once, onto a device), not here."""
        piece = self.view(entry)[index]
        self.bytes_read += piece.nbytes
        return piece

    def view(self, entry: TensorEntry) -> np.ndarray:
        """The tensor as a read-only array over the mapped file (nothing read until indexed)."""
        mapped = self._maps.get(entry.file)
        if mapped is None:
            mapped = self._maps[entry.file] = np.memmap(entry.file, mode="r", dtype=np.uint8)
        count = math.prod(entry.shape)
        dtype = numpy_dtype(entry.dtype)
        flat = mapped[entry.offset : entry.offset + count * dtype.itemsize].view(dtype)
        return flat.reshape(entry.shape)

    def close(self) -> None:
        self._maps.clear()


@dataclass(frozen=True)
class PlannedTensor:
    """A tensor to write: its name, numpy dtype name and shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * numpy_dtype(self.dtype).itemsize


def plan_shards(tensors: list[PlannedTensor], shard_bytes: int) -> list[list[PlannedTensor]]:
    """`tensors` in order, cut into files of at most `shard_bytes` each (a larger tensor alone)."""
    shards: list[list[PlannedTensor]] = [[]]
    size = 0
    for tensor in tensors:
        if shards[-1] and size + tensor.nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(tensor)
        size += tensor.nbytes
    return shards


def shard_names(count: int, prefix: str = "model") -> list[str]:
    """transformers' file names for `count` shards."""
    if count == 1:
        return [f"{prefix}.safetensors"]
    return [f"{prefix}-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]


def write_shards(
    directory: Path, tensors: list[PlannedTensor], produce, shard_bytes: int, prefix: str = "model"
) -> list[str]:
    """Writes `tensors` as safetensors shards in `directory`, named after `prefix` as shard_names
    says, each one's values from `produce(name)` (a numpy array of its dtype and shape) as it is
    written, so host memory holds one tensor at a time; then the index
    (`prefix`.safetensors.index.json) where there are several. Each file is written under a
    temporary name and renamed once complete. Returns the file names."""
    shards = plan_shards(tensors, shard_bytes)
    names = shard_names(len(shards), prefix)
    for name, shard in zip(names, shards, strict=True):
        _write_file(directory / name, shard, produce)
    if len(shards) > 1:
        weight_map = {
            tensor.name: name for name, shard in zip(names, shards, strict=True) for tensor in shard
        }
        index = {
            "metadata": {"total_size": sum(t.nbytes for t in tensors)},
            "weight_map": dict(sorted(weight_map.items())),
        }
        (directory / f"{prefix}.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return names


def _write_file(file: Path, tensors: list[PlannedTensor], produce) -> None:
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for tensor in tensors:
        header[tensor.name] = {
            "dtype": CODES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + tensor.nbytes],
        }
        offset += tensor.nbytes
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    temporary = file.with_name(f".{file.name}.partial")
    with open(temporary, "wb") as stream:
        stream.write(struct.pack("<Q", len(encoded)))
        stream.write(encoded)
        for tensor in tensors:
            array = np.ascontiguousarray(produce(tensor.name), dtype=numpy_dtype(tensor.dtype))
            if array.shape != tensor.shape:
                raise ValueError(f"{tensor.name}: produced shape {array.shape}, planned {tensor.shape}")
            stream.write(array.tobytes())
    temporary.rename(file)
