"""Images for the vision tests, and the tiny vision-language model they run on
(mlxserve/tiny_vision_model.py)."""

from __future__ import annotations

import io

from mlxserve.tiny_vision_model import (  # noqa: F401 (the tests' imports)
    build_tiny_qwen2_vl,
    build_tiny_qwen3_vl,
)


def checkerboard_png(size: tuple[int, int] = (64, 48), square: int = 8, colors=None) -> bytes:
    """A PNG of two colours in squares: an image whose patches differ."""
    from PIL import Image

    first, second = colors or ((200, 30, 30), (10, 200, 40))
    image = Image.new("RGB", size, first)
    for x in range(size[0]):
        for y in range(size[1]):
            if (x // square + y // square) % 2:
                image.putpixel((x, y), second)
    data = io.BytesIO()
    image.save(data, format="PNG")
    return data.getvalue()
