"""Ollama's wire details shared by its routes: `{"error": "..."}` errors, model names with tags,
and RFC 3339 times."""

from __future__ import annotations

import datetime as dt

from quart import Blueprint

from ..errors import APIError, NotFound

DEFAULT_TAG = "latest"


def ollama_errors(blueprint: Blueprint) -> None:
    """Errors on this blueprint's routes in Ollama's shape: `{"error": message}`, same status."""

    @blueprint.errorhandler(APIError)
    async def as_ollama_error(error: APIError):
        return {"error": error.message}, error.status, error.headers


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
