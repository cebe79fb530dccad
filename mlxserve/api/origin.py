"""Web pages may not drive the server unless --cors-origin names them.

A page on any site can POST to 127.0.0.1 without a CORS preflight when the body is text/plain or
form-encoded, which we read as JSON for curl's sake; it cannot read the answer, but it can
generate or switch models. Browsers name the page's origin in `Origin`; other clients send none.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from quart import request

from .errors import APIError

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class ForbiddenOrigin(APIError):
    status = 403
    type = "permission_error"


def check_origin(allowed: tuple[str, ...]) -> None:
    """Refuse a state-changing request from a web page of another origin than ours or those
    allowed (`/docs`, served by us, is our own origin)."""
    origin = request.headers.get("Origin")
    if origin is None or request.method in SAFE_METHODS:
        return
    if origin in allowed or "*" in allowed or urlsplit(origin).netloc == request.host:
        return
    raise ForbiddenOrigin(
        f"A web page from {origin} may not call this server; start it with "
        f"--cors-origin {origin} to allow that page.",
        code="origin_not_allowed",
    )
