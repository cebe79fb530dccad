"""GET /v1/models: the model this server serves."""

from __future__ import annotations

from quart import Blueprint, current_app

from ..engine.model_host import model_id_for
from .errors import NotFound

blueprint = Blueprint("models", __name__)
STARTED = "created"


def served_model_id() -> str:
    return model_id_for(current_app.config["ENGINE"].model_source)


def check_model_name(name: str | None) -> None:
    """A request may name the served model (by id or as given on the command line) or none."""
    engine = current_app.config["ENGINE"]
    if name in (None, "", served_model_id(), engine.model_source):
        return
    raise NotFound(
        f"The model '{name}' does not exist. This server serves '{served_model_id()}'.",
        param="model",
        code="model_not_found",
    )


def model_card() -> dict:
    engine = current_app.config["ENGINE"]
    card = {
        "id": served_model_id(),
        "object": "model",
        "created": current_app.config[STARTED],
        "owned_by": "mlxserve",
        "status": engine.state,
    }
    if engine.loaded is not None:
        card["context_length"] = engine.loaded.context_length
    return card


@blueprint.get("/v1/models")
async def list_models():
    return {"object": "list", "data": [model_card()]}


@blueprint.get("/v1/models/<path:name>")
async def get_model(name: str):
    check_model_name(name)
    return model_card()
