"""GET /health: 200 once the default model is ready, 503 while it loads (llama.cpp's
contract), with the load's progress."""

from __future__ import annotations

from quart import Blueprint, current_app

from ..engine import LOADING_STATES
from .errors import error_body

blueprint = Blueprint("health", __name__)


@blueprint.get("/health")
async def health():
    engine = current_app.config["POOL"].default
    state, loaded = engine.state, engine.loaded
    if state == "ready" and loaded is not None:
        return {"status": "ok", "model": loaded.model_id}
    if state == "ready":  # and nothing loaded: an unload is freeing the model's memory
        state = "unloaded"
    loading = state in LOADING_STATES
    body = error_body(
        "Loading model" if loading else f"Engine {state}",
        "service_unavailable",
        code="model_loading" if loading else "engine_error",
    )
    body["status"] = state
    progress = engine.load_progress
    if progress is not None:
        body["progress"] = progress.as_dict()
    return body, 503, {"Retry-After": "1"}
