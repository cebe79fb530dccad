"""What a front door may know of an engine's state without importing MLX: its states, and the
errors that say it cannot take a request now."""

from __future__ import annotations

from typing import Literal

EngineState = Literal["starting", "loading", "ready", "unloaded", "error", "stopped", "restarting"]
# A model on its way: a first load, a switch, or (two processes) a restarted engine's reload.
LOADING_STATES = frozenset({"starting", "loading", "restarting"})
NO_ROOM_RETRY_AFTER_S = 5  # a busy model frees its memory once its requests end


class EngineError(Exception):
    """The engine cannot take work now (not loaded, failed, stopped)."""

    def __init__(self, message: str, state: EngineState):
        super().__init__(message)
        self.state = state


class NoRoom(Exception):
    """The model does not fit beside the resident ones, and none of them can be unloaded."""


class EmbeddingFailed(RuntimeError):
    """An embedding request could not be served: the model is not an embedding model, or its
    batch failed (the message says which)."""
