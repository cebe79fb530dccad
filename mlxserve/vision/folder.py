"""Whether a model folder is a vision-language model, and whether this install can read its
images: no MLX, for the registry's listing (the front) and the engine's load alike."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Mapping
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
