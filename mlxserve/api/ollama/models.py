"""Ollama's model routes: the probes (`/`, `/api/version`), the list (`/api/tags`), one model's
details (`/api/show`), the loaded one (`/api/ps`), and clear refusals for the registry's
management routes, since models here come from folders on this Mac, not from a registry."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from quart import Blueprint, current_app
from quart_schema import document_request, hide

from ...chat.templates import template_text
from ...fim import TEMPLATES, FimTemplate
from ...registry import ModelEntry, describe, read_json
from ..errors import InvalidRequest, NotSupported
from ..models import registry, served_model_id
from ..parsing import read_json_object, validate
from .model_details import details, digest, modified_at, parameter_count
from .protocol import MAX_KEEP_ALIVE_S, ShowRequest
from .shape import model_not_found, rfc3339, tagged, untagged

blueprint = Blueprint("ollama_models", __name__)
# The Ollama release whose API these routes follow; clients compare it to enable features.
OLLAMA_API_VERSION = "0.12.0"
NEVER = "2318-01-01T00:00:00Z"  # expires_at of a model that is never unloaded for idleness
ELSEWHERE = (
    "mlxserve serves the MLX models already on this Mac (the Hugging Face cache, LM Studio's "
    "folder, --models-dir; GET /api/tags lists them)"
)


@blueprint.get("/")
async def root():
    return "Ollama is running (mlxserve)", 200, {"Content-Type": "text/plain; charset=utf-8"}


@blueprint.get("/api/version")
async def version():
    return {"version": OLLAMA_API_VERSION}


@blueprint.get("/api/tags")
async def tags():
    return {"models": [listing(entry) for entry in entries()]}


@blueprint.post("/api/show")
@document_request(ShowRequest)
async def show():
    body = validate(ShowRequest, await read_json_object())
    entry = ollama_entry(body.model_name)
    config = read_json(entry.path / "config.json")
    family = config.get("model_type", "")
    info: dict[str, Any] = {
        "general.architecture": family,
        "general.parameter_count": parameter_count(entry.path),
    }
    context = serving_context(entry) or entry.context_length
    if context:
        info[f"{family}.context_length"] = context
    for key, name in (("hidden_size", "embedding_length"), ("num_hidden_layers", "block_count")):
        if isinstance(config.get(key), int):
            info[f"{family}.{name}"] = config[key]
    return {
        "license": "",
        "modelfile": f"# served by mlxserve from {entry.path}\nFROM {entry.path}\n",
        # Modelfile parameters, one per line: clients (Continue, Raycast) read num_ctx here.
        "parameters": f"num_ctx {context}" if context else "",
        "template": template_of(entry),
        "details": details(entry),
        "model_info": info,
        "capabilities": capabilities(entry),
        "modified_at": rfc3339(modified_at(entry.path)),
    }


@blueprint.get("/api/ps")
async def running():
    engine = current_app.config["ENGINE"]
    loaded = engine.loaded
    if loaded is None:
        return {"models": []}
    entry = served_entry()
    card = listing(entry)
    card.pop("modified_at")
    memory = engine.memory_bytes()
    card.update(
        size=memory,
        size_vram=memory,  # unified memory: all of it is the GPU's
        expires_at=expires_at(engine),
        context_length=loaded.context_length,
    )
    return {"models": [card]}


@blueprint.route("/api/pull", methods=["POST"])
@blueprint.route("/api/push", methods=["POST"])
@blueprint.route("/api/create", methods=["POST"])
@blueprint.route("/api/copy", methods=["POST"])
@blueprint.route("/api/delete", methods=["DELETE"])
@blueprint.route("/api/blobs/<digest_>", methods=["HEAD", "POST"])
@hide  # always a 501: nothing to document
async def manage(digest_: str | None = None):
    raise NotSupported(
        f"{ELSEWHERE}; it does not pull, push, create, copy or delete models. Download one with "
        "`hf download mlx-community/<model>`, or start mlxserve with --models-dir."
    )


@blueprint.route("/api/embed", methods=["POST"])
@blueprint.route("/api/embeddings", methods=["POST"])
@hide
async def embed():
    raise NotSupported("mlxserve does not compute embeddings yet: it serves generation only.")


def entries() -> list[ModelEntry]:
    """The registry's models, the served one first (also when it came from elsewhere)."""
    found = registry().scan()
    served = served_entry()
    return [served, *(e for e in found if e.name != served.name)]


def served_entry() -> ModelEntry:
    engine = current_app.config["ENGINE"]
    entry = registry().find(served_model_id())
    if entry is None:
        loaded = engine.loaded
        path = loaded.path if loaded is not None else engine.model_source
        entry = describe(Path(path), served_model_id(), "command line")
    return entry


def ollama_entry(name: str) -> ModelEntry:
    """The model an Ollama client names (`name` or `name:latest`); Ollama's 404 otherwise."""
    bare = untagged(name)
    if bare in (served_model_id(), current_app.config["ENGINE"].model_source):
        return served_entry()
    entry = registry().find(bare) or registry().find(name)
    if entry is None:
        raise model_not_found(name)
    return entry


def requested_entry(name: str) -> ModelEntry:
    """The model a generation names: the served one, or with --allow-switch another known one
    (loaded in its place). Unknown names are Ollama's 404; the OpenAI routes' stand-in for any
    name does not apply, since these clients pick names from /api/tags."""
    entry = ollama_entry(name)
    if entry.name != served_model_id() and not current_app.config["SETTINGS"].allow_switch:
        raise InvalidRequest(
            f'model "{name}" is not the one this server runs ("{tagged(served_model_id())}"): '
            "start mlxserve with --allow-switch to switch models on request, or switch with "
            "POST /admin/load.",
            param="model",
        )
    return entry


def listing(entry: ModelEntry) -> dict[str, Any]:
    """An /api/tags entry."""
    return {
        "name": tagged(entry.name),
        "model": tagged(entry.name),
        "modified_at": rfc3339(modified_at(entry.path)),
        "size": entry.size_bytes,
        "digest": digest(entry.path),
        "details": details(entry),
    }


def loaded_as(entry: ModelEntry):
    """The loaded model when `entry` is the one served and loaded, else None."""
    loaded = current_app.config["ENGINE"].loaded
    return loaded if loaded is not None and entry.name == served_model_id() else None


def serving_context(entry: ModelEntry) -> int | None:
    loaded = loaded_as(entry)
    return loaded.context_length if loaded is not None else None


def template_of(entry: ModelEntry) -> str:
    """The chat template (Jinja); for a FIM model, behind Ollama's `{{ .Suffix }}` section
    that says how the server builds infill prompts (Continue looks for `.Suffix` to use FIM)."""
    loaded = loaded_as(entry)
    if loaded is not None:
        chat = template_text(loaded.tokenizer, current_app.config["SETTINGS"].chat.template)
    else:
        template = read_json(entry.path / "tokenizer_config.json").get("chat_template")
        chat = template if isinstance(template, str) else ""
    fim = next((t for t in TEMPLATES if t.name == entry.fim), None)
    if fim is None:
        return chat
    return f"{fim_section(fim)}{{{{- else }}}}{chat}{{{{- end }}}}"


def fim_section(fim: FimTemplate) -> str:
    """A FIM template's prompt in Ollama's template syntax."""
    before = f"{fim.prefix}{{{{ .Prompt }}}}"
    after = f"{fim.suffix}{{{{ .Suffix }}}}"
    parts = after + before if fim.suffix_first else before + after
    return f"{{{{- if .Suffix }}}}{parts}{fim.middle or ''}"


def capabilities(entry: ModelEntry) -> list[str]:
    """completion always; insert with FIM tokens; tools (the server renders tool calls for any
    template); thinking when the template thinks."""
    found = ["completion"]
    if entry.fim:
        found.append("insert")
    found.append("tools")
    loaded = loaded_as(entry)
    if loaded is not None:
        thinking = bool(getattr(loaded.tokenizer, "has_thinking", False))
    else:
        thinking = "<think>" in template_of(entry)
    if thinking:
        found.append("thinking")
    return found


def expires_at(engine) -> str:
    idle = engine.idle_unload_s
    left = engine.slot.last_work + idle - time.monotonic() if idle is not None else math.inf
    if left > MAX_KEEP_ALIVE_S:
        return NEVER
    return rfc3339(time.time() + max(0.0, left))
