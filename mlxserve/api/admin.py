"""Model management for the menubar app and scripts: status, load, unload, pin.

Behind the API key like every route but /health. Models are named from the registry, or as
served (an adapter, an alias); never by a path.
"""

from __future__ import annotations

import asyncio
import time

from pydantic import BaseModel, ConfigDict, Field
from quart import Blueprint, current_app, request
from quart_schema import document_request

from ..engine import EngineError
from .errors import InvalidRequest
from .models import STARTED, acquire, default_engine, known_model, pool, served_model_id
from .parsing import read_json_object, validate

blueprint = Blueprint("admin", __name__)
DEFAULT_WAIT_S = 3600.0  # a loaded model becomes the default once ready, however long that is


class LoadRequest(BaseModel):
    """POST /admin/load: a model by its id from GET /v1/models (never a path)."""

    model_config = ConfigDict(extra="allow")
    model: str = Field(min_length=1, max_length=1024, description="an id from GET /v1/models")
    default: bool = Field(
        True,
        description="it answers requests that name no model from now on (the menubar's "
        "current model)",
    )
    pinned: bool | None = Field(None, description="pin it (never unloaded to make room) or not")


class UnloadRequest(BaseModel):
    """POST /admin/unload: a served model (none: the default one)."""

    model_config = ConfigDict(extra="allow")
    model: str | None = Field(None, max_length=1024, description="an id from GET /v1/models")


class PinRequest(BaseModel):
    """POST /admin/pin: keep a served model in memory whatever else is asked for, or not."""

    model_config = ConfigDict(extra="allow")
    model: str = Field(min_length=1, max_length=1024, description="an id from GET /v1/models")
    pinned: bool = Field(True, description="false unpins it")


def model_status(engine) -> dict:
    """One served model: its state, load, memory and work."""
    models = pool()
    name = engine.model_name
    load = engine.load_progress  # read once: the engine thread clears it when the load ends
    progress = load.as_dict() if load is not None else None
    adapter = models.adapters.get(name)
    return {
        "model": name,
        "path": engine.model_source,
        "state": engine.state if engine.started else "unloaded",
        "default": name == models.default_name,
        "pinned": models.is_pinned(name),
        "base_model": adapter.base if adapter is not None else None,
        "memory_bytes": models.footprint(engine) if engine.loaded is not None else 0,
        "loading_s": progress["elapsed_s"] if progress is not None else None,
        "progress": progress,
        "load_error": engine.load_error,
        "error": engine.error,
        "queue": engine.stats.waiting_groups,
        "pending_sequences": engine.pending_sequences,
        "active_sequences": engine.stats.active_sequences,
        "tokens_per_second": round(engine.current_tokens_per_second(), 2),
        "idle_unload_s": engine.idle_unload_s,
    }


def status() -> dict:
    """The default model's status at the top (what a one-model client reads), every served
    model's under `models`, and the memory budget they share."""
    models = pool()
    engine = default_engine()
    default = model_status(engine)
    return {
        "state": default["state"],
        "model": served_model_id(),
        "model_path": engine.model_source,
        **{k: default[k] for k in ("loading_s", "progress", "load_error", "error")},
        "memory_bytes": engine.memory_bytes(),
        "uptime_s": int(time.time()) - current_app.config[STARTED],
        **{
            k: default[k]
            for k in (
                "queue",
                "pending_sequences",
                "active_sequences",
                "tokens_per_second",
                "idle_unload_s",
            )
        },
        "memory_budget_bytes": models.budget_bytes,
        "models_memory_bytes": models.memory_used(),
        "models": [model_status(e) for e in models.engines],
    }


def served_name(name: str) -> tuple[str, str | None]:
    """(name, source) of the model an admin request names: a served one, else a known one."""
    served = pool().resolve(name, by_source=False)
    if served is not None:
        return served, None
    entry = known_model(name)
    return entry.name, str(entry.path)


@blueprint.get("/admin/status")
async def get_status():
    return status()


@blueprint.post("/admin/load")
@document_request(LoadRequest)
async def load():
    """Load a model beside the others (room made as for a request): 202 while it loads, 200
    once ready; a generation model becomes the default unless `default` is false (an
    embedding model or a reranker never does: requests naming no model are generation's)."""
    body = validate(LoadRequest, await read_json_object())
    name, source = served_name(body.model)
    models = pool()
    if body.pinned is not None:
        models.pin(name, body.pinned)
    engine = await acquire(name, source)
    ready = engine.state == "ready" and engine.loaded is not None
    if body.default and ready:
        if engine.loaded.kind == "generate":
            models.make_default(name)
    elif body.default:  # once it is ready; a model that fails to load leaves the default as is
        asyncio.get_running_loop().create_task(_default_once_ready(engine))
    return status(), 200 if ready else 202


async def _default_once_ready(engine) -> None:
    await engine.ensure_loaded(timeout=DEFAULT_WAIT_S)
    if engine.state == "ready" and engine.loaded is not None and engine.loaded.kind == "generate":
        pool().make_default(engine.model_name)


@blueprint.post("/admin/unload")
@document_request(UnloadRequest)
async def unload():
    """Free a model's memory once its requests end; the next request for it loads it again."""
    empty = not (await request.get_data()).strip()  # the menubar's unload sends no body
    body = validate(UnloadRequest, {} if empty else await read_json_object())
    models = pool()
    engine = models.get(models.resolve(body.model, False) or "") if body.model else None
    engine = engine or (default_engine() if not body.model else None)
    if engine is None:
        known_model(body.model)  # 404 for a name nothing knows
        return status(), 200  # known, not loaded: nothing to free
    try:
        engine.unload()
    except EngineError as error:
        raise InvalidRequest(str(error), param="model", code="unload_not_possible") from error
    return status(), 202


@blueprint.post("/admin/pin")
@document_request(PinRequest)
async def pin():
    """Pin a served model (never unloaded to make room for another) or unpin it."""
    body = validate(PinRequest, await read_json_object())
    name, _ = served_name(body.model)
    pool().pin(name, body.pinned)
    return status(), 200
