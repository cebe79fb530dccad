"""Ollama's model routes: the probes (`/`, `/api/version`), the list (`/api/tags`), one model's
details (`/api/show`), the loaded ones (`/api/ps`), and clear refusals for the registry's
management routes, since models here come from folders on this Mac, not from a registry."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from quart import Blueprint, current_app
from quart_schema import document_request, hide

from ...chat.templates import template_text, writes_reasoning
from ...families import output_format
from ...fim import TEMPLATES, FimTemplate
from ...registry import ModelEntry, describe, read_json
from ..errors import InvalidRequest, NotSupported
from ..models import pool, registry
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
    """Every model in memory, the default first: its weights' memory, when it expires."""
    cards = []
    for engine in pool().resident():
        loaded = engine.loaded
        if loaded is None:  # on its way: Ollama lists a model once it is loaded
            continue
        card = listing(served_entry(engine))
        card.pop("modified_at")
        memory = pool().footprint(engine)
        card.update(
            size=memory,
            size_vram=memory,  # unified memory: all of it is the GPU's
            expires_at=expires_at(engine),
            context_length=loaded.context_length,
        )
        cards.append(card)
    return {"models": cards}


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


def entries() -> list[ModelEntry]:
    """The registry's models, the served ones first (also those that came from elsewhere)."""
    found = registry().scan()
    served = [served_entry(e) for e in pool().engines]
    names = {e.name for e in served}
    return [*served, *(e for e in found if e.name not in names)]


def served_entry(engine) -> ModelEntry:
    """A served model's entry: the registry's, else one read from its folder (an adapter's
    is its base's, under the adapter's name)."""
    name = engine.model_name
    entry = registry().find(name)
    if entry is not None:
        return entry
    adapter = pool().adapters.get(name)
    if adapter is not None:
        base = pool().get(adapter.base)
        path = base.model_source if base is not None else adapter.path
    else:
        path = engine.loaded.path if engine.loaded is not None else engine.model_source
    return describe(Path(path), name, "command line") or _bare_entry(name, Path(path))


def _bare_entry(name: str, path: Path) -> ModelEntry:
    return ModelEntry(name, path, "command line", 0, None, None, None)


def served_engine(name: str):
    """The engine a served model's Ollama name (`name` or `name:latest`, or an alias) has;
    None for a model not served here."""
    models = pool()
    bare = untagged(name)
    resolved = models.resolve(bare) or models.resolve(name)
    if resolved is None:
        return None
    return models.get(resolved) or models.engine_for(resolved)


def ollama_entry(name: str) -> ModelEntry:
    """The model an Ollama client names (`name` or `name:latest`); Ollama's 404 otherwise."""
    engine = served_engine(name)
    if engine is not None:
        return served_entry(engine)
    bare = untagged(name)
    entry = registry().find(bare) or registry().find(name)
    if entry is None:
        raise model_not_found(name)
    return entry


def requested_model(name: str) -> str:
    """The model a generation names: a served one, or with --allow-switch another known one
    (loaded beside them). Unknown names are Ollama's 404; the OpenAI routes' stand-in for any
    name does not apply, since these clients pick names from /api/tags."""
    engine = served_engine(name)
    if engine is not None:
        return engine.model_name
    entry = ollama_entry(name)
    if not current_app.config["SETTINGS"].allow_switch:
        served = ", ".join(f'"{tagged(e.model_name)}"' for e in pool().engines)
        raise InvalidRequest(
            f'model "{name}" is not served here ({served}): start mlxserve with '
            "--allow-switch to load models on request, or load it with POST /admin/load.",
            param="model",
        )
    return entry.name


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
    """The loaded model when `entry` is served and loaded, else None."""
    engine = pool().get(pool().resolve(entry.name) or "")
    return engine.loaded if engine is not None else None


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
    template); thinking when the template thinks; vision when it is loaded with its image side.
    An embedding model: embedding alone (a
    reranker has none of Ollama's)."""
    if entry.kind != "generate":
        return ["embedding"] if entry.kind == "embed" else []
    found = ["completion"]
    if entry.fim:
        found.append("insert")
    found.append("tools")
    loaded = loaded_as(entry)
    if loaded is not None:
        thinking = writes_reasoning(loaded.tokenizer)
    else:
        template = template_of(entry)
        own = output_format(template)
        thinking = "<think>" in template or (own is not None and own.reasons)
    if thinking:
        found.append("thinking")
    if loaded is not None and loaded.takes_images:
        found.append("vision")
    return found


def expires_at(engine) -> str:
    left = engine.keep_alive_left_s()
    left = math.inf if left is None else left
    if left > MAX_KEEP_ALIVE_S:
        return NEVER
    return rfc3339(time.time() + max(0.0, left))
