"""Model management for the menubar app and scripts: status, load (switch), unload.

Behind the API key like every route but /health. Models are named from the registry only.
"""

from __future__ import annotations

import time

from pydantic import BaseModel, ConfigDict, Field
from quart import Blueprint, current_app
from quart_schema import document_request

from ..engine import EngineError
from .errors import InvalidRequest
from .models import STARTED, known_model, served_model_id
from .parsing import read_json_object, validate

blueprint = Blueprint("admin", __name__)


class LoadRequest(BaseModel):
    """POST /admin/load: a model by its id from GET /v1/models (never a path)."""

    model_config = ConfigDict(extra="allow")
    model: str = Field(min_length=1, max_length=1024, description="an id from GET /v1/models")


def status() -> dict:
    engine = current_app.config["ENGINE"]
    load = engine.load_progress  # read once: the engine thread clears it when the load ends
    progress = load.as_dict() if load is not None else None
    return {
        "state": engine.state,
        "model": served_model_id(),
        "model_path": engine.model_source,
        "loading_s": progress["elapsed_s"] if progress is not None else None,
        "progress": progress,
        "load_error": engine.load_error,
        "error": engine.error,
        "memory_bytes": engine.memory_bytes(),
        "uptime_s": int(time.time()) - current_app.config[STARTED],
        "queue": engine.stats.waiting_groups,
        "pending_sequences": engine.pending_sequences,
        "active_sequences": engine.stats.active_sequences,
        "tokens_per_second": round(engine.current_tokens_per_second(), 2),
        "idle_unload_s": engine.idle_unload_s,
    }


@blueprint.get("/admin/status")
async def get_status():
    return status()


@blueprint.post("/admin/load")
@document_request(LoadRequest)
async def load():
    """Switch to a known model: 202 while it loads (requests in flight finish on the old one)."""
    entry = known_model(validate(LoadRequest, await read_json_object()).model)
    engine = current_app.config["ENGINE"]
    if entry.name == served_model_id() and engine.state == "ready":
        return status(), 200
    try:
        engine.switch(str(entry.path), entry.name)
    except EngineError as error:
        raise InvalidRequest(str(error), param="model", code="switch_not_possible") from error
    return status(), 202


@blueprint.post("/admin/unload")
async def unload():
    """Free the model's memory; the next request loads it again."""
    current_app.config["ENGINE"].unload()
    return status(), 202
