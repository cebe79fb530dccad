"""Ollama's POST /api/embed (inputs truncated to the model's length unless `truncate: false`,
vectors normalised) and its older POST /api/embeddings (one prompt, the model's own vector).
As Ollama, an empty input answers no vectors and only loads the model."""

from __future__ import annotations

from typing import Any

from quart import Blueprint
from quart_schema import document_request

from ..dispatch import ready_model
from ..embeddings.protocol import OllamaEmbeddingsRequest, OllamaEmbedRequest
from ..embeddings.run import embed, json_response
from ..embeddings.vectors import cut, normalised
from ..errors import InvalidRequest
from ..parsing import read_json_object, validate
from .models import requested_model
from .serving import keeper

blueprint = Blueprint("ollama_embed", __name__)


@blueprint.post("/api/embed")
@document_request(OllamaEmbedRequest)
async def embed_route():
    body = validate(OllamaEmbedRequest, await read_json_object())
    name = requested_model(body.model)
    inputs = _ollama_inputs(body.input)
    if not inputs:
        engine, _ = await ready_model(name, kind="embed")
        keeper(engine, body.keep_alive)()
        return {"model": body.model, "embeddings": []}
    done = await embed(name, inputs, truncate=body.truncate, prompt_name=body.prompt_name)
    keeper(done.engine, body.keep_alive)()
    vectors = cut(normalised(done.vectors), body.dimensions, done.loaded)
    return await json_response(
        lambda: {
            "model": body.model,
            "embeddings": vectors.tolist(),
            "total_duration": done.total_ns,
            "load_duration": done.load_ns,
            "prompt_eval_count": done.tokens,
        }
    )


@blueprint.post("/api/embeddings")
@document_request(OllamaEmbeddingsRequest)
async def embeddings_route():
    body = validate(OllamaEmbeddingsRequest, await read_json_object())
    name = requested_model(body.model)
    if not body.prompt:
        engine, _ = await ready_model(name, kind="embed")
        keeper(engine, body.keep_alive)()
        return {"embedding": []}
    done = await embed(name, body.prompt, param="prompt", truncate=True)
    keeper(done.engine, body.keep_alive)()
    return {"embedding": done.vectors[0].tolist()}


def _ollama_inputs(value: Any) -> list[str]:
    """Ollama's `input`: a string or a list of strings (an empty string is no input)."""
    if value is None or value == "":
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        if any(not v for v in value):
            raise InvalidRequest("input has an empty string", param="input")
        return value
    raise InvalidRequest("invalid input type", param="input")
