"""llama.cpp's GET /props: the defaults a `/completion` runs with, the context, the chat
template and the batch's size, which llama.vscode and llama.cpp's web UI read at start-up.
There is no POST /props (405): settings change with the command line only, as llama.cpp's do
unless started with `--props`."""

from __future__ import annotations

from importlib.metadata import version
from typing import Any

from quart import Blueprint, current_app

from ...engine import MAX_BATCH
from ..planning import ready_model
from .completion import generation_settings
from .protocol import NativeCompletionRequest

blueprint = Blueprint("llamacpp_props", __name__)


@blueprint.get("/props")
async def get_props():
    engine, loaded = await ready_model(None)
    params = generation_settings(NativeCompletionRequest.model_validate({"prompt": ""}), loaded)
    n_ctx = params.pop("n_ctx")
    return {
        "default_generation_settings": {
            "id": 0,
            "id_task": -1,
            "n_ctx": n_ctx,
            "speculative": False,
            "is_processing": engine.stats.active_sequences > 0,
            "params": params,
            "prompt": "",
            "next_token": {
                "has_next_token": True,
                "has_new_line": False,
                "n_remain": -1,
                "n_decoded": 0,
                "stopping_word": "",
            },
        },
        "total_slots": MAX_BATCH,
        "model_path": loaded.path,
        "n_ctx": n_ctx,
        "chat_template": chat_template_text(loaded.tokenizer),
        "modalities": {"vision": False, "audio": False},
        "build_info": f"mlxserve {version('mlxserve')}",
    }


def chat_template_text(tokenizer) -> str:
    """The Jinja text chat renders with: --chat-template's, else the model's ("" for none)."""
    override = current_app.config["SETTINGS"].chat.template
    if override is not None:
        return override
    source: Any = getattr(tokenizer, "chat_template", None)
    if isinstance(source, dict):
        source = source.get("default", next(iter(source.values()), ""))
    return source if isinstance(source, str) else ""
