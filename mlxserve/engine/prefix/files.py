"""The prefix cache's file format: safetensors files (a length, a JSON header, the arrays'
bytes) written and read with plain file I/O, and the metadata that says what a file holds (its
tokens, a checksum of its arrays, the kind of cache its KV goes back into)."""

from __future__ import annotations

import base64
import json
import struct
import zlib
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache

from ..mlx_lm_compat.quantized_kv import Packing, QuantizedRowKVCache, packing_of

MAX_HEADER_BYTES = 64 << 20

# safetensors' names of the dtypes KV comes in (quantized KV: packed in uint32); bfloat16 is
# written from a uint16 view of it
DTYPES = {mx.float32: "F32", mx.float16: "F16", mx.bfloat16: "BF16", mx.uint32: "U32"}


def tokens_text(tokens: np.ndarray) -> str:
    return base64.b64encode(tokens.astype("<i4").tobytes()).decode()


def tokens_of(text: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype="<i4").astype(np.int32)


def checksum(arrays: dict[str, Any]) -> str:
    """CRC-32 of the arrays' bytes, in their names' order (MLX or numpy arrays alike)."""
    crc = 0
    for key in sorted(arrays):
        crc = zlib.crc32(memoryview(arrays[key]), crc)
    return f"{crc:08x}"


NUMPY_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "U32": np.uint32}


def load_safetensors(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """A file `save_safetensors` wrote, into numpy (bfloat16 as its bits in uint16); a file
    whose size is not what its header says fails."""
    with path.open("rb") as file:
        data = file.read()
    header, start = checked_header(data, len(data))
    metadata = header.pop("__metadata__", {})
    arrays = {}
    for key, entry in header.items():
        first, last = entry["data_offsets"]
        dtype = np.dtype(NUMPY_DTYPES[entry["dtype"]])
        count = (last - first) // dtype.itemsize
        arrays[key] = np.frombuffer(data, dtype, count, start + first).reshape(entry["shape"])
    return arrays, metadata


def checked_header(head: bytes, size: int) -> tuple[dict[str, Any], int]:
    """The safetensors header at the start of `head` (all of its bytes there) and where the
    arrays start, checked against the file's `size` (a truncated file fails)."""
    (length,) = struct.unpack("<Q", head[:8])
    if length > MAX_HEADER_BYTES:
        raise ValueError("header length out of range")
    header = json.loads(head[8 : 8 + length])
    ends = [t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"]
    if 8 + length + max(ends, default=0) != size:
        raise ValueError("truncated (its size is not what its header says)")
    return header, 8 + length


def save_safetensors(
    path: Path, arrays: dict[str, np.ndarray], dtype: str, metadata: dict[str, str]
) -> None:
    """The safetensors layout (a length, a JSON header, the arrays' bytes), written with plain
    file writes: they release the GIL, so the engine thread runs on meanwhile."""
    header: dict[str, Any] = {"__metadata__": metadata}
    offset = 0
    for key, array in arrays.items():
        header[key] = {
            "dtype": dtype,
            "shape": list(array.shape),
            "data_offsets": [offset, offset + array.nbytes],
        }
        offset += array.nbytes
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    with path.open("wb") as file:
        file.write(struct.pack("<Q", len(encoded)))
        file.write(encoded)
        for array in arrays.values():
            file.write(memoryview(array))


def read_header(path: Path) -> dict[str, Any]:
    """A safetensors file's header, checked against the file's size (a truncated file fails)."""
    with path.open("rb") as file:
        head = file.read(8)
        head += file.read(min(struct.unpack("<Q", head)[0], MAX_HEADER_BYTES))
    return checked_header(head, path.stat().st_size)[0]


def packing_metadata(cache: list[Any]) -> dict[str, str] | None:
    packing = packing_of(cache[0])
    if packing is None or packing.dtype is None:
        return None
    return {
        "kv_bits": str(packing.bits),
        "kv_group_size": str(packing.group_size),
        "kv_dtype": str(packing.dtype).rsplit(".", 1)[-1],
    }


def new_layer(metadata: dict[str, str]) -> KVCache:
    """An empty cache of the kind a segment's metadata says (packed, for quantized KV)."""
    if "kv_bits" not in metadata:
        return KVCache()
    dtype = getattr(mx, metadata["kv_dtype"])
    return QuantizedRowKVCache(
        Packing(int(metadata["kv_bits"]), int(metadata["kv_group_size"]), dtype)
    )
