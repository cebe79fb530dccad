"""A request's way to its engine, in the HTTP layer: not while draining, the model it names
made ready, the shared plan (mlxserve/planning/plan.py) made with this server's settings and
admitted, and its sequences submitted."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from quart import current_app

from ..engine import EngineError, GenerationEvent
from ..planning.plan import Plan, compile_constraint, make_plan
from ..planning.request import Request
from .admission import admit, refuse_if_draining
from .errors import InvalidRequest, engine_unavailable
from .metrics import timed
from .models import engine_for, pool

# A request waits this long for a model being (re)loaded, then gets 503: longer than a small
# model's load on a slow machine, shorter than clients' own timeouts (openai's: 600 s).
LOAD_WAIT_S = 120.0


async def plan_request(request: Request):
    """The checks and planning every front door shares: (engine, loaded model, plan)."""
    engine, loaded = await ready_model(request.model)
    plan = await plan_on(engine, loaded, request)
    return engine, loaded, plan


async def ready_model(model: str | None, kind: str | None = "generate"):
    """Not draining, and the model `model` routes to (`models.engine_for`) is loaded:
    (engine, loaded model). Chat calls this first: its prompt needs the model's template.
    `kind`: what the route needs of it ("generate", "embed"; None: any model)."""
    refuse_if_draining(current_app.config)
    engine = await engine_for(model)
    await engine.ensure_loaded(timeout=LOAD_WAIT_S)
    try:
        try:
            loaded = engine.check_ready()
        except EngineError as error:
            if error.state not in ("ready", "unloaded"):
                raise
            # Loaded, then unloaded for being idle before this request reached it (a short
            # idle unload, a slow machine): loaded once more.
            await engine.ensure_loaded(timeout=LOAD_WAIT_S)
            loaded = engine.check_ready()
    except EngineError as error:
        raise engine_unavailable(error) from error
    if kind is not None and loaded.kind != kind:
        raise InvalidRequest(wrong_kind(loaded.model_id, loaded.kind), param="model")
    return engine, loaded


def wrong_kind(name: str, kind: str) -> str:
    if kind == "rerank":
        return f"{name} is a reranker: it answers POST /v1/rerank, not this route"
    if kind == "embed":
        return (
            f"{name} is an embedding model: it answers POST /v1/embeddings (and Ollama's "
            "/api/embed, llama.cpp's /embedding), not text generation"
        )
    return (
        f"{name} is a text generation model, not an embedding model or a reranker; serve one "
        "with --embedding-model (GET /v1/models lists each model's kind)"
    )


async def plan_on(engine, loaded, request: Request) -> Plan:
    """The plan for `request` on the loaded model, its constraint compiled, admitted."""
    settings = current_app.config["SETTINGS"]
    timeout = settings.limits.grammar_timeout_s
    constraint = request.constraint
    grammar = await compile_constraint(loaded, constraint, timeout) if constraint else None
    plan = await asyncio.to_thread(make_plan, request, loaded, settings, grammar)
    others = sum(e.admitted_kv_bytes() for e in pool().engines if e is not engine)
    plan.reservation = admit(engine, loaded, plan.sequences, settings, others)
    return plan


def submit(engine, plan: Plan) -> AsyncIterator[GenerationEvent]:
    """The plan's sequences handed to the engine, timed for /metrics (call it inside the
    request: a stream runs outside the app context)."""
    return timed(engine.submit(plan.sequences, plan.reservation))
