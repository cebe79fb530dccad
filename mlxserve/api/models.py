"""GET /v1/models: the models this machine has (the registry), the served ones first with their
state; and which engine the `model` field of a request selects."""

from __future__ import annotations

import logging

from quart import Blueprint, current_app

from ..chat.templates import chat_capabilities
from ..engine import LOADING_STATES, EngineError
from ..engine.states import NO_ROOM_RETRY_AFTER_S, NoRoom
from ..planning.model_facts import SPECULATION
from ..registry import ModelEntry, Registry
from .errors import InvalidRequest, NotFound, ServiceUnavailable
from .log_once import FirstSight

blueprint = Blueprint("models", __name__)
log = logging.getLogger("mlxserve.api")
STARTED = "created"


def pool():
    """The served models' engines (engine/models/pool.py)."""
    return current_app.config["POOL"]


def served_model_id() -> str:
    """The default model's name: requests that name no model (or one not served) get it."""
    return pool().default_name


def default_engine():
    return pool().default


def registry() -> Registry:
    return current_app.config["REGISTRY"]


def known_model(name: str) -> ModelEntry:
    """The registry's entry for `name`; 404 for anything else (a path or repo id is never loaded
    from a request)."""
    entry = registry().find(name)
    if entry is None:
        raise NotFound(
            f"The model '{name}' does not exist. Known models: GET /v1/models.",
            param="model",
            code="model_not_found",
        )
    return entry


async def engine_for(name: str | None):
    """The engine a request's `model` routes to, its model loaded or on its way: a served
    model (by name, source or alias), the default for none; with --allow-switch any known
    model, loaded beside the others. Any other name is answered by the default model, as
    llama.cpp and LM Studio do (clients send fixed names: gpt-3.5-turbo, davinci-002), unless
    --strict-model-names asks for 404s. A model that does not fit beside busy or pinned ones:
    503 with Retry-After."""
    models = pool()
    resolved, source = models.resolve(name), None
    if resolved is None:
        settings = current_app.config["SETTINGS"]
        target = models.aliases.get(name, name)
        entry = known_model(target) if settings.strict_model_names else registry().find(target)
        if entry is not None and settings.allow_switch:
            resolved, source = entry.name, str(entry.path)
        elif settings.strict_model_names:
            raise InvalidRequest(
                f"The model '{name}' is not served here (served: "
                f"{', '.join(pool().names())}); this server loads other models on request only "
                "when started with --allow-switch.",
                param="model",
                code="model_not_loaded",
            )
        else:
            _note_stand_in(name)
            resolved = models.default_name
    return await acquire(resolved, source)


async def acquire(name: str, source: str | None = None):
    """`pool().acquire`, its NoRoom a 503 with Retry-After."""
    try:
        return await pool().acquire(name, source)
    except EngineError as error:
        if error.state in LOADING_STATES:  # the engine process restarts (ipc/)
            raise ServiceUnavailable(
                str(error), code="model_loading", headers={"Retry-After": "1"}
            ) from error
        raise InvalidRequest(str(error), param="model", code="switch_not_possible") from error
    except NoRoom as error:
        raise ServiceUnavailable(
            str(error),
            code="model_memory_full",
            headers={"Retry-After": str(NO_ROOM_RETRY_AFTER_S)},
        ) from error


_stand_ins = FirstSight()


def _note_stand_in(name: str) -> None:
    """Say once per name that the loaded model answers for it."""
    if _stand_ins.first(name):
        log.info(
            "requests for model %r are answered by %s (--strict-model-names refuses them)",
            name,
            served_model_id(),
        )


def model_card(entry: ModelEntry | None = None, name: str | None = None) -> dict:
    """A /v1/models card: the registry's `entry` (or a served model by `name`), and for a
    served model its state, memory, context and chat capabilities."""
    models = pool()
    name = entry.name if entry is not None else name or served_model_id()
    engine = models.get(models.resolve(name) or "")
    card = {
        "id": name,
        "object": "model",
        "created": current_app.config[STARTED],
        "owned_by": "mlxserve",
        "loaded": engine is not None and engine.loaded is not None,
    }
    adapter = models.adapters.get(name)
    if adapter is not None:  # vLLM's card for a LoRA adapter
        card.update(parent=adapter.base, root=adapter.path)
    if engine is not None and engine.started:
        card["status"] = engine.state
        card["default"] = name == models.default_name
        card["pinned"] = models.is_pinned(name)
        card["memory_bytes"] = models.footprint(engine) if engine.loaded is not None else 0
        card["queue"] = engine.stats.waiting_groups
        card["pending_sequences"] = engine.pending_sequences
        loaded = engine.loaded
        if loaded is not None:
            card["kind"] = loaded.kind
            card["context_length"] = loaded.context_length
            if loaded.kind != "generate":
                card["dimensions"] = loaded.dimensions
            else:
                settings = current_app.config["SETTINGS"]
                card["speculative"] = speculative_for(loaded, settings, card["default"])
                card.update(chat_capabilities(loaded.tokenizer, settings.chat))
                card["vision"] = loaded.takes_images
                card["cache_kinds"] = list(loaded.cache_kinds)
                card["features_off"] = dict(loaded.features_off)
    if entry is not None:
        card.update({k: v for k, v in entry.card().items() if k != "id"})
    return card


def speculative_for(loaded, settings, default_model: bool) -> dict | None:
    """The server's drafting for this model, None where it is off for the server or for the
    model's architecture (its `features_off` says why)."""
    if SPECULATION in loaded.features_off:
        return None
    return settings.speculative_for(default_model)


def _cards() -> list[dict]:
    """The served models first (the default, then the others, adapters included), then the
    rest of the registry, then the aliases."""
    models = pool()
    entries = {e.name: e for e in registry().scan()}
    served = models.names()
    cards = [model_card(entries.get(n), n) for n in served]
    cards += [model_card(e) for n, e in entries.items() if n not in served]
    for alias, target in models.aliases.items():
        card = {"id": alias, "object": "model", "created": current_app.config[STARTED]}
        cards.append({**card, "owned_by": "mlxserve", "alias_of": target})
    return cards


@blueprint.get("/v1/models")
@blueprint.get("/models")
async def list_models():
    """OpenAI's list; `/models` is llama.cpp's name for it, open without the API key as there."""
    return {"object": "list", "data": _cards()}


@blueprint.get("/v1/models/<path:name>")
async def get_model(name: str):
    models = pool()
    served = models.resolve(name)
    if served is not None:
        return model_card(registry().find(served), served)
    return model_card(known_model(name))
