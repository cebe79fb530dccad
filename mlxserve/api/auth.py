"""Optional API key: `Authorization: Bearer KEY` or `X-Api-Key: KEY`, compared in constant time."""

from __future__ import annotations

import hmac

from quart import request

from .errors import AuthenticationError

# llama.cpp's public routes, and Ollama's probes: a client may check that the server is up
# and what it serves before it has a key.
OPEN_PATHS = frozenset({"/health", "/models", "/", "/api/version"})


def check_api_key(expected: str | None) -> None:
    if not expected or request.path in OPEN_PATHS:
        return
    given = request.headers.get("X-Api-Key", "")
    authorization = request.headers.get("Authorization", "")
    if authorization[:7].lower() == "bearer ":
        given = authorization[7:].strip()
    if not given:
        raise AuthenticationError(
            "Missing API key: send 'Authorization: Bearer YOUR_KEY'.", code="missing_api_key"
        )
    if not hmac.compare_digest(given.encode(), expected.encode()):
        raise AuthenticationError("Incorrect API key provided.", code="invalid_api_key")
