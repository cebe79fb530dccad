"""Whether a model folder is a vision-language model, whether this install can read its images,
and how many tokens an image becomes: no MLX, for the registry's listing (the front) and the
engine's load alike."""

from __future__ import annotations

import importlib.util
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def has_vision_part(config: Mapping[str, Any]) -> bool:
    """Whether a model's config.json describes a vision part (`vision_config`)."""
    return isinstance(config, Mapping) and isinstance(config.get("vision_config"), dict)


def is_vision_folder(folder: Path | None) -> bool:
    """Whether the folder holds a vision-language model (its config has a vision part)."""
    if folder is None:
        return False
    try:
        return has_vision_part(json.loads((Path(folder) / "config.json").read_text()))
    except (OSError, ValueError):
        return False


def vision_installed() -> bool:
    """Whether mlx-vlm (`pip install 'mlxserve[vision]'`) is importable."""
    return importlib.util.find_spec("mlx_vlm") is not None


MAX_ASPECT = 200  # Qwen's processors refuse an image whose sides differ more


@dataclass(frozen=True)
class ImageTokens:
    """How many prompt tokens an image becomes, read off a vision folder's configs (no MLX),
    so that the front counts them for the context window and the KV budget. Qwen's families
    resize an image to a grid of merged patches within a pixel range; the others give each
    image a fixed count."""

    patch: int = 0  # the grid's kind: pixels a patch side (0: a fixed count)
    merge: int = 1  # patches merged a side into one token
    min_pixels: int = 0
    max_pixels: int = 0
    fixed: int = 0  # tokens an image of a family without a grid

    def refusal(self, width: int, height: int) -> str | None:
        """Why the model's processor would refuse an image of this size, or None."""
        if self.patch and max(width, height) > MAX_ASPECT * min(width, height):
            return (
                f"an image of {width}x{height} pixels is too narrow for this model: its sides "
                f"may differ at most {MAX_ASPECT} times"
            )
        return None

    def count(self, width: int, height: int) -> int:
        if not self.patch:
            return self.fixed
        rows, columns = _grid(height, width, self.patch * self.merge, self)
        return rows * columns // (self.patch * self.merge) ** 2

    @classmethod
    def of_folder(cls, folder: Path) -> ImageTokens:
        from ..registry import read_json  # the registry imports this module

        config = read_json(folder / "config.json")
        processor = read_json(folder / "preprocessor_config.json")
        size = processor.get("size") if isinstance(processor.get("size"), dict) else {}
        if processor.get("merge_size") and processor.get("patch_size"):
            return cls(
                patch=int(processor["patch_size"]),
                merge=int(processor["merge_size"]),
                min_pixels=int(processor.get("min_pixels") or size.get("shortest_edge") or 0),
                max_pixels=int(processor.get("max_pixels") or size.get("longest_edge") or 0),
            )
        vision = config.get("vision_config") or {}
        fixed = (
            config.get("mm_tokens_per_image")
            or config.get("image_seq_length")
            or processor.get("image_seq_length")
        )
        if not fixed and vision.get("image_size") and vision.get("patch_size"):
            fixed = (int(vision["image_size"]) // int(vision["patch_size"])) ** 2
        return cls(fixed=int(fixed or 0))


def _grid(height: int, width: int, factor: int, limits: ImageTokens) -> tuple[int, int]:
    """The size Qwen's image processor resizes an image to: sides rounded to `factor`, the
    area brought within [min_pixels, max_pixels] keeping the aspect."""
    rows = max(factor, round(height / factor) * factor)
    columns = max(factor, round(width / factor) * factor)
    if limits.max_pixels and rows * columns > limits.max_pixels:
        beta = math.sqrt(height * width / limits.max_pixels)
        rows = max(factor, math.floor(height / beta / factor) * factor)
        columns = max(factor, math.floor(width / beta / factor) * factor)
    elif rows * columns < limits.min_pixels:
        beta = math.sqrt(limits.min_pixels / (height * width))
        rows = math.ceil(height * beta / factor) * factor
        columns = math.ceil(width * beta / factor) * factor
    return rows, columns
