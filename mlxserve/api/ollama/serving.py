"""What /api/generate and /api/chat share: the model a request names, made ready (the wait is
its load_duration); the answer streamed or whole; keep_alive applied once it ends; and requests
with nothing to generate, which only load or unload the model."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ...chat.templates import writes_reasoning
from ...engine import EngineError
from ...planning.defaults import logprobs_k
from ..dispatch import ready_model, submit
from ..errors import InvalidRequest
from ..models import pool
from .models import requested_model
from .protocol import FOREVER, GenerationFields
from .replies import NDJSON_HEADERS, Clock, Reply, stream, whole
from .shape import rfc3339


def keeper(engine, requested: float | None) -> Callable[[], None]:
    """What to do once a request ends: keep the model `requested` seconds from then (FOREVER;
    0 unloads it once no work is left), or the server's --idle-unload when the client did not
    say, as Ollama falls back to its own default."""
    if requested is None:
        seconds = engine.default_idle_unload_s
    else:
        seconds = None if requested == FOREVER else requested
    return lambda: engine.keep_alive(seconds)


async def ready(body: GenerationFields, clock: Clock):
    """(engine, loaded model) for the model the request names; the wait counts as loading."""
    name = requested_model(body.model)
    before = time.perf_counter_ns()
    engine, loaded = await ready_model(name)
    clock.load_ns = time.perf_counter_ns() - before
    return engine, loaded


def check_thinking(body: GenerationFields, loaded) -> None:
    """think: true asks for reasoning a model without thinking tags cannot give (Ollama: 400)."""
    if body.think not in (None, False) and not writes_reasoning(loaded.tokenizer):
        raise InvalidRequest(f'"{body.model}" does not support thinking', param="think")


async def answer(engine, plan, body: GenerationFields, reply_fields: dict[str, Any]):
    """Generate `plan` and answer as the request asked: NDJSON lines, or one object."""
    reply = Reply(
        model=body.model,
        plan=plan,
        after=keeper(engine, body.keep_alive),
        logprobs=logprobs_k(body.logprobs, body.top_logprobs),
        **reply_fields,
    )
    events = submit(engine, plan)
    if body.stream:
        return stream(events, reply), 200, NDJSON_HEADERS
    return await whole(events, reply)


async def load_or_unload(body: GenerationFields, empty: dict[str, Any]) -> dict[str, Any]:
    """A request with nothing to generate: load the model (and keep it for keep_alive), or
    with keep_alive 0 unload it. `empty` is the route's empty piece of text."""
    name = requested_model(body.model)
    if body.keep_alive == 0:
        reason = "unload"
        engine = pool().get(name)
        if engine is not None and engine.loaded is not None:
            try:
                engine.unload()
            except EngineError as error:
                raise InvalidRequest(str(error), param="keep_alive") from error
    else:
        reason = "load"
        engine, _ = await ready_model(name)
        keeper(engine, body.keep_alive)()
    return {
        "model": body.model,
        "created_at": rfc3339(time.time()),
        **empty,
        "done": True,
        "done_reason": reason,
    }
