"""One top-k alternative to a generated token: plain data, so the engine's events cross to the
front process without MLX."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Alternative:
    token_id: int
    text: str
    logprob: float
