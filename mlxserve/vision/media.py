"""Image URLs read where the user allowed them: `http(s)://` fetched only with
--allow-image-urls (a time and size limit, a few redirects), `file://` read only inside
--media-dir (its real path, so no `..` or link leads out of it). Anything else, or either kind
not allowed, is a 400 naming the field and the flag. Runs on planning's worker thread, never on
the event loop."""

from __future__ import annotations

import time
from pathlib import Path
from urllib.parse import unquote, urlparse
from urllib.request import url2pathname

from ..api.errors import InvalidRequest
from ..settings import ChatSettings
from .images import MAX_IMAGE_BYTES, checked, from_data_url, too_large

FETCH_TIMEOUT_S = 10.0  # a whole fetch: connecting, redirects and the body
MAX_REDIRECTS = 3


def image_from_url(url: str, where: str, settings: ChatSettings) -> bytes:
    """The image `url` names (a data URL, or one the settings allow), checked."""
    scheme = url.strip().split(":", 1)[0].lower() if isinstance(url, str) and ":" in url else ""
    if scheme in ("http", "https"):
        if not settings.image_urls:
            raise _refused(
                where,
                "this server fetches image URLs only when started with --allow-image-urls; "
                "send the image itself as a data URL (data:image/png;base64,...)",
            )
        return checked(_fetched(url.strip(), where), where)
    if scheme == "file":
        if settings.media_dir is None:
            raise _refused(
                where,
                "this server reads file:// images only from a folder given with --media-dir; "
                "send the image itself as a data URL (data:image/png;base64,...)",
            )
        return checked(_read_file(url.strip(), where, Path(settings.media_dir)), where)
    return from_data_url(url, where)


def _fetched(url: str, where: str) -> bytes:
    import httpx

    deadline = time.monotonic() + FETCH_TIMEOUT_S
    try:
        with httpx.Client(
            timeout=FETCH_TIMEOUT_S, follow_redirects=True, max_redirects=MAX_REDIRECTS
        ) as client:
            with client.stream("GET", url) as response:
                if response.status_code >= 400:
                    raise _failed(where, url, f"HTTP {response.status_code}")
                declared = response.headers.get("content-length", "")
                if declared.isdigit() and int(declared) > MAX_IMAGE_BYTES:
                    raise too_large(where)
                body = bytearray()
                for chunk in response.iter_bytes():
                    body += chunk
                    if len(body) > MAX_IMAGE_BYTES:
                        raise too_large(where)
                    if time.monotonic() > deadline:
                        raise _failed(where, url, f"not fetched in {FETCH_TIMEOUT_S:g} s")
                return bytes(body)
    except httpx.TooManyRedirects as error:
        raise _failed(where, url, f"more than {MAX_REDIRECTS} redirects") from error
    except httpx.TimeoutException as error:
        raise _failed(where, url, f"not fetched in {FETCH_TIMEOUT_S:g} s") from error
    except (httpx.HTTPError, ValueError) as error:
        raise _failed(where, url, str(error) or type(error).__name__) from error


def _read_file(url: str, where: str, media_dir: Path) -> bytes:
    parsed = urlparse(url)
    if parsed.netloc not in ("", "localhost"):
        raise _refused(
            where, f"a file URL names a host ({parsed.netloc}); only local files are read"
        )
    root = media_dir.resolve()
    try:
        path = Path(url2pathname(unquote(parsed.path))).resolve(strict=True)
    except (OSError, RuntimeError) as error:
        raise _failed(where, url, "no such file") from error
    if not path.is_relative_to(root) or not path.is_file():
        raise _refused(where, f"{url} is not a file inside --media-dir")
    if path.stat().st_size > MAX_IMAGE_BYTES:
        raise too_large(where)
    try:
        return path.read_bytes()
    except OSError as error:
        raise _failed(where, url, error.strerror or str(error)) from error


def _refused(where: str, why: str) -> InvalidRequest:
    return InvalidRequest(f"{where}: {why}.", param=where, code="invalid_image_url")


def _failed(where: str, url: str, why: str) -> InvalidRequest:
    return InvalidRequest(
        f"{where}: could not read the image at {url[:200]}: {why}.",
        param=where,
        code="image_fetch_failed",
    )
