"""Installed packages' versions, read from their metadata; a source tree run without
installing has none for mlxserve, which must never fail a request."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version


def installed(package: str) -> str | None:
    """`package`'s installed version, or None where it is not installed."""
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def mlxserve_version() -> str:
    return installed("mlxserve") or "unknown"
