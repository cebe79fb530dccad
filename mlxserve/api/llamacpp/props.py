"""llama.cpp's GET /props: the defaults a `/completion` runs with, the context, the chat
template and the batch's size, which llama.vscode and llama.cpp's web UI read at start-up.
There is no POST /props (405): settings change with the command line only, as llama.cpp's do
unless started with `--props`."""

from __future__ import annotations

from quart import Blueprint, current_app, request

from ...chat.templates import template_text
from ...engine import MAX_BATCH
from ...versions import mlxserve_version
from ..dispatch import ready_model
from ..models import speculative_for
from .completion import generation_settings
from .protocol import NativeCompletionRequest

blueprint = Blueprint("llamacpp_props", __name__)


@blueprint.get("/props")
async def get_props():
    engine, loaded = await ready_model(request.args.get("model"))  # llama.cpp's router mode
    params = generation_settings(NativeCompletionRequest.model_validate({"prompt": ""}), loaded)
    n_ctx = params.pop("n_ctx")
    speculative = speculative_for(loaded, current_app.config["SETTINGS"], default_model=True)
    if speculative is not None:  # llama.cpp's names for its draft lengths
        params["speculative.n_max"] = speculative["num_draft_tokens"]
        params["speculative.n_min"] = 0
    return {
        "default_generation_settings": {
            "id": 0,
            "id_task": -1,
            "n_ctx": n_ctx,
            "speculative": speculative is not None,
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
        "chat_template": template_text(
            loaded.tokenizer, current_app.config["SETTINGS"].chat.template
        ),
        "modalities": {"vision": False, "audio": False},
        "cache_kinds": list(loaded.cache_kinds),  # ours: what the model's layers keep
        "features_off": dict(loaded.features_off),  # ours: engine features off, and why
        "build_info": f"mlxserve {mlxserve_version()}",
    }
