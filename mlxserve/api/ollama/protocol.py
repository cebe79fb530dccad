"""Ollama's request shapes for the model routes."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, StrictBool


class ShowRequest(BaseModel):
    """POST /api/show: `model` (older clients send `name`)."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    name: str | None = None
    verbose: StrictBool = False

    @property
    def model_name(self) -> str:
        return self.model or self.name or ""
