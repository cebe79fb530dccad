"""What Ollama's clients read about a model folder (/api/tags, /api/show, /api/ps): its family,
parameter count, quantization, a digest and when it changed, from its files alone."""

from __future__ import annotations

import functools
import hashlib
import json
import math
import struct
from pathlib import Path
from typing import Any

from ...registry import ModelEntry, read_json

QUANTIZATION_LEVELS = {"float16": "F16", "bfloat16": "BF16", "float32": "F32"}
QUANTIZED_PARTS = (".scales", ".biases")


def details(entry: ModelEntry) -> dict[str, Any]:
    """Ollama's `details` object."""
    family = read_json(entry.path / "config.json").get("model_type", "")
    return {
        "parent_model": "",
        "format": "safetensors",
        "family": family,
        "families": [family] if family else None,
        "parameter_size": human_count(parameter_count(entry.path)),
        "quantization_level": quantization_level(entry.quantization),
    }


def quantization_level(quantization: str | None) -> str:
    """mlx-lm's "4-bit" as Ollama's "Q4"; float types as F16, BF16, F32."""
    if quantization is None:
        return ""
    if quantization.endswith("-bit"):
        return "Q" + quantization.removesuffix("-bit")
    return QUANTIZATION_LEVELS.get(quantization, quantization.upper())


def human_count(count: int) -> str:
    """8030261312 -> "8.0B", 134515008 -> "135M", as Ollama writes parameter sizes."""
    if count >= 10**9:
        return f"{count / 10**9:.1f}B"
    if count >= 10**6:
        return f"{round(count / 10**6)}M"
    return f"{round(count / 10**3)}K"


def parameter_count(folder: Path) -> int:
    return _parameter_count(folder, _stamp(folder))


@functools.lru_cache(maxsize=64)
def _parameter_count(folder: Path, _stamp: tuple) -> int:
    """Weights counted from the safetensors headers; a quantized matrix's packed words count
    as the parameters they hold (32 / bits each), its scales and biases not at all."""
    quantization = read_json(folder / "config.json").get("quantization") or {}
    default_bits = quantization.get("bits")
    tensors: dict[str, tuple[str, list[int]]] = {}
    for weights in sorted(folder.glob("*.safetensors")):
        tensors.update(_header(weights))
    total = 0
    for name, (dtype, shape) in tensors.items():
        stem = name.rsplit(".", 1)[0]
        if name.endswith(QUANTIZED_PARTS) and f"{stem}.weight" in tensors:
            continue
        count = math.prod(shape)
        layer = quantization.get(stem)
        bits = layer.get("bits") if isinstance(layer, dict) else default_bits
        if dtype == "U32" and bits and f"{stem}.scales" in tensors:
            count = count * 32 // bits
        total += count
    return total


def _header(path: Path) -> dict[str, tuple[str, list[int]]]:
    try:
        with path.open("rb") as file:
            (length,) = struct.unpack("<Q", file.read(8))
            header = json.loads(file.read(length))
    except (OSError, ValueError, struct.error):
        return {}
    return {
        name: (info["dtype"], info["shape"])
        for name, info in header.items()
        if name != "__metadata__" and isinstance(info, dict)
    }


def digest(folder: Path) -> str:
    """A stable identity of the folder's files (names, sizes, times): Ollama's `digest`."""
    files = sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in _files(folder))
    return hashlib.sha256(repr(files).encode()).hexdigest()


def modified_at(folder: Path) -> float:
    return max((f.stat().st_mtime for f in _files(folder)), default=0.0)


def _files(folder: Path) -> list[Path]:
    return [f for f in folder.iterdir() if f.is_file()]


def _stamp(folder: Path) -> tuple:
    return tuple(sorted((f.name, f.stat().st_mtime_ns) for f in folder.glob("*.safetensors")))
