"""Ollama's wire details shared by its routes: `{"error": "..."}` errors (the app's error
handlers use it on /api/ paths), model names with tags, and RFC 3339 times."""

from __future__ import annotations

import datetime as dt

from ..errors import NotFound

DEFAULT_TAG = "latest"


def is_ollama_path(path: str) -> bool:
    return path.startswith("/api/")


def ollama_error(body: dict) -> dict:
    """An OpenAI-shaped error body in Ollama's shape: `{"error": message}` (same status)."""
    return {"error": body["error"]["message"]}


def tagged(name: str) -> str:
    """A model's name as Ollama lists it: with a tag (`name:latest`)."""
    return name if ":" in name.rsplit("/", 1)[-1] else f"{name}:{DEFAULT_TAG}"


def untagged(name: str) -> str:
    """`name:latest` -> `name`; other tags stay (a registry name may hold one)."""
    return name.removesuffix(f":{DEFAULT_TAG}")


def model_not_found(name: str) -> NotFound:
    return NotFound(f'model "{name}" not found, try pulling it first', param="model")


def rfc3339(timestamp: float) -> str:
    return dt.datetime.fromtimestamp(timestamp, dt.timezone.utc).isoformat()
