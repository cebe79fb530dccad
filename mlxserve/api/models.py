"""GET /v1/models: the models this machine has (the registry), the loaded one marked; and what
the `model` field of a request selects."""

from __future__ import annotations

import logging

from quart import Blueprint, current_app

from ..chat.templates import chat_capabilities
from ..engine import LOADING_STATES, EngineError
from ..registry import ModelEntry, Registry
from .errors import InvalidRequest, NotFound
from .log_once import FirstSight

blueprint = Blueprint("models", __name__)
log = logging.getLogger("mlxserve.api")
STARTED = "created"


def served_model_id() -> str:
    return current_app.config["ENGINE"].model_name


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


def check_model_name(name: str | None) -> None:
    """A request may name the served model (by id or as given on the command line), none, or
    with --allow-switch any known model, which is then loaded in its place. Any other name is
    answered by the loaded model, as llama.cpp and LM Studio do (clients send fixed names:
    gpt-3.5-turbo, davinci-002), unless --strict-model-names asks for 404s."""
    engine = current_app.config["ENGINE"]
    if name in (None, "", served_model_id(), engine.model_source):
        return
    settings = current_app.config["SETTINGS"]
    entry = known_model(name) if settings.strict_model_names else registry().find(name)
    if entry is not None and settings.allow_switch:
        try:
            engine.switch(str(entry.path), entry.name)
        except EngineError as error:
            raise InvalidRequest(str(error), param="model", code="switch_not_possible") from error
        return
    if settings.strict_model_names:
        raise InvalidRequest(
            f"The model '{name}' is not the one loaded ('{served_model_id()}'); this server "
            "switches models only when started with --allow-switch.",
            param="model",
            code="model_not_loaded",
        )
    _note_stand_in(name)


_stand_ins = FirstSight()


def _note_stand_in(name: str) -> None:
    """Say once per name that the loaded model answers for it."""
    if _stand_ins.first(name):
        log.info(
            "requests for model %r are answered by %s (--strict-model-names refuses them)",
            name,
            served_model_id(),
        )


def model_card(entry: ModelEntry | None = None) -> dict:
    engine = current_app.config["ENGINE"]
    name = entry.name if entry is not None else served_model_id()
    serving = name == served_model_id()
    card = {
        "id": name,
        "object": "model",
        "created": current_app.config[STARTED],
        "owned_by": "mlxserve",
        "loaded": serving and engine.state not in LOADING_STATES,
    }
    if serving:
        card["status"] = engine.state
        if engine.loaded is not None:
            card["context_length"] = engine.loaded.context_length
            chat = current_app.config["SETTINGS"].chat
            card.update(chat_capabilities(engine.loaded.tokenizer, chat))
    if entry is not None:
        card.update({k: v for k, v in entry.card().items() if k != "id"})
    return card


def _entries() -> list[ModelEntry | None]:
    entries = registry().scan()
    served = served_model_id()
    if not any(e.name == served for e in entries):  # a repo id served from the hub, say
        return [None, *entries]
    return entries


@blueprint.get("/v1/models")
@blueprint.get("/models")
async def list_models():
    """OpenAI's list; `/models` is llama.cpp's name for it, open without the API key as there."""
    return {"object": "list", "data": [model_card(e) for e in _entries()]}


@blueprint.get("/v1/models/<path:name>")
async def get_model(name: str):
    if name in (served_model_id(), current_app.config["ENGINE"].model_source):
        return model_card(registry().find(served_model_id()))
    return model_card(known_model(name))
