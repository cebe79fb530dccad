"""Images as the doors receive them (data URLs, base64), read into checked bytes: each a 400
naming its field when it is not an image, too large or one too many. The front reads them; the
engine process gets the bytes (`GenerationRequest.images`). URLs of other kinds are media.py's,
read only where the user allowed them."""

from __future__ import annotations

import base64
import binascii
import io
import re

from ..api.errors import InvalidRequest

MAX_IMAGE_BYTES = 20 << 20  # an encoded image, as OpenAI's limit
MAX_IMAGE_PIXELS = 40_000_000  # a decoded one: a small PNG can unpack to gigabytes
MAX_IMAGES = 16  # a request's
_DATA_URL = re.compile(
    r"^data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?:;[\w=.+-]+)*;base64,(?P<data>.*)$", re.S
)


def from_data_url(url: str, where: str) -> bytes:
    """The image in a `data:image/...;base64,` URL."""
    match = _DATA_URL.match(url.strip()) if isinstance(url, str) else None
    if match is None:
        raise InvalidRequest(
            f"{where} must be a data URL of a base64 image (data:image/png;base64,...).",
            param=where,
            code="invalid_image_url",
        )
    return from_base64(match.group("data"), where)


def from_base64(text: str, where: str) -> bytes:
    """The image in base64 text (Ollama's images, Anthropic's base64 sources)."""
    if not isinstance(text, str):
        raise InvalidRequest(f"{where} must be a base64 string.", param=where)
    if len(text) > MAX_IMAGE_BYTES * 4 // 3 + 4:
        raise too_large(where)
    try:
        data = base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError) as error:
        raise InvalidRequest(f"{where} is not valid base64: {error}", param=where) from error
    return checked(data, where)


def checked(data: bytes, where: str) -> bytes:
    """`data` if it is an image Pillow can read, within the size limits."""
    from PIL import Image, UnidentifiedImageError

    if len(data) > MAX_IMAGE_BYTES:
        raise too_large(where)
    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
            if width * height > MAX_IMAGE_PIXELS:
                raise InvalidRequest(
                    f"{where}: an image of {width}x{height} pixels is over the limit of "
                    f"{MAX_IMAGE_PIXELS:,} pixels.",
                    param=where,
                    code="image_too_large",
                )
            image.verify()  # the file's structure; load() below decodes its pixels
        with Image.open(io.BytesIO(data)) as image:
            image.load()
    except InvalidRequest:
        raise
    except (
        UnidentifiedImageError,
        Image.DecompressionBombError,
        OSError,
        ValueError,
        SyntaxError,
    ) as error:
        raise InvalidRequest(
            f"{where} is not an image this server can read (PNG, JPEG, WebP, GIF, BMP, ...): "
            f"{error}",
            param=where,
            code="invalid_image",
        ) from error
    return data


def pixel_size(data: bytes) -> tuple[int, int]:
    """A checked image's (width, height), read from its header."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        return image.size


def check_count(count: int, where: str = "messages") -> None:
    if count > MAX_IMAGES:
        raise InvalidRequest(
            f"{count} images in one request; the limit is {MAX_IMAGES}.",
            param=where,
            code="too_many_images",
        )


def too_large(where: str) -> InvalidRequest:
    return InvalidRequest(
        f"{where}: the image is over {MAX_IMAGE_BYTES >> 20} MB.",
        param=where,
        code="image_too_large",
    )
