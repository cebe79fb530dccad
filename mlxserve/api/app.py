"""The Quart application: routes, limits, auth, and error handlers that keep every failure JSON."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from quart import Quart, g, request
from quart_cors import cors
from werkzeug.exceptions import HTTPException

from ..engine.states import EngineError
from ..registry import Registry
from ..settings import DEFAULT_MODEL, Settings
from . import access_log, admin, health, metrics, models, openapi
from .anthropic import messages as anthropic_messages
from .anthropic.shape import anthropic_error, is_anthropic_path
from .auth import check_api_key
from .embeddings import rerank
from .errors import APIError, engine_unavailable, error_body
from .llamacpp import completion as llamacpp_completion
from .llamacpp import embedding as llamacpp_embedding
from .llamacpp import infill as llamacpp_infill
from .llamacpp import props as llamacpp_props
from .llamacpp import slots as llamacpp_slots
from .llamacpp import tokens as llamacpp_tokens
from .ollama import chat as ollama_chat
from .ollama import embed as ollama_embed
from .ollama import generate as ollama_generate
from .ollama import models as ollama_models
from .ollama.shape import is_ollama_path, ollama_error
from .openai import chat as openai_chat
from .openai import completions as openai_completions
from .openai import embeddings as openai_embeddings
from .openai import responses_api as openai_responses
from .origin import check_origin
from .parsing import UNKNOWN_FIELDS_HEADER, unknown_fields_header

log = logging.getLogger("mlxserve.api")

HTTP_ERROR_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
}
HTTP_ERROR_CODES = {
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    413: "request_too_large",
}


def create_app(settings: Settings, pool) -> Quart:
    """`pool`: the served models' engines (engine/models/pool.py)."""
    app = Quart("mlxserve")
    limits = settings.limits
    app.config.update(
        POOL=pool,
        SETTINGS=settings,
        REGISTRY=registry_for(settings),
        MAX_CONTENT_LENGTH=limits.max_body_bytes,
        # Quart's 60 s default silently cuts long streams and slow generations (REFERENCE §6).
        RESPONSE_TIMEOUT=None,
        BODY_TIMEOUT=limits.body_timeout_s,
    )
    app.config[models.STARTED] = int(time.time())
    access_log.install(app)
    openapi.install(app, settings)
    app.json.sort_keys = False  # after QuartSchema, which installs its own JSON provider
    for module in (
        admin,
        openai_completions,
        openai_chat,
        openai_responses,
        health,
        metrics,
        models,
        llamacpp_completion,
        llamacpp_infill,
        llamacpp_tokens,
        llamacpp_props,
        llamacpp_slots,
        openai_embeddings,
        llamacpp_embedding,
        rerank,
        ollama_models,
        ollama_generate,
        ollama_chat,
        ollama_embed,
        anthropic_messages,
    ):  # this order is /openapi.json's order of paths
        app.register_blueprint(module.blueprint)
    metrics.install(app)
    if settings.cors_origins:
        cors(
            app,
            allow_origin=list(settings.cors_origins),
            allow_headers=["Authorization", "Content-Type", "X-Api-Key"],
            allow_methods=["GET", "POST", "OPTIONS"],
            expose_headers=[UNKNOWN_FIELDS_HEADER],
            allow_credentials=True,  # as llama.cpp: pages may send the key (only these origins)
            max_age=600,
        )

    @app.before_request
    async def authenticate() -> None:
        check_origin(settings.cors_origins)
        if request.method != "OPTIONS":  # a browser's CORS preflight carries no credentials
            check_api_key(settings.api_key)

    @app.after_request
    async def settle_unread_body(response):
        return await read_rest_of_body(response)

    @app.after_request
    async def name_unknown_fields(response):
        names = g.get("unknown_fields")
        if names:
            response.headers[UNKNOWN_FIELDS_HEADER] = unknown_fields_header(names)
        return response

    @app.errorhandler(APIError)
    async def api_error(error: APIError):
        return in_shape(error.body(), error.status), error.status, error.headers

    @app.errorhandler(EngineError)
    async def engine_not_ready(error: EngineError):
        """The model left between a request's checks and its submission (an unload, a switch,
        a failure): a 503, as the checks themselves answer, not a 500."""
        return await api_error(engine_unavailable(error))

    @app.errorhandler(HTTPException)
    async def http_error(error: HTTPException):
        status = error.code or 500
        message = error.description or error.name
        if status == 404:
            message = f"Unknown route: {request.method} {request.path}"
        elif status == 405:
            message = f"Method {request.method} is not allowed on {request.path}"
        elif status == 408:
            message = f"The request body did not arrive within {limits.body_timeout_s:g} s"
        elif status == 413:
            message = f"Request body too large: the limit is {limits.max_body_bytes} bytes"
        body = error_body(
            message,
            HTTP_ERROR_TYPES.get(status, "invalid_request_error"),
            code=HTTP_ERROR_CODES.get(status),
        )
        return in_shape(body, status), status

    @app.errorhandler(Exception)
    async def unexpected(error: Exception):
        log.exception("unhandled error on %s %s", request.method, request.path)
        body = error_body("The server had an internal error.", "server_error")
        return in_shape(body, 500), 500

    return app


def in_shape(body: dict, status: int) -> dict:
    """An error in the shape of the protocol the route belongs to: Ollama's on its /api/ routes,
    Anthropic's on /v1/messages, OpenAI's elsewhere (llama.cpp's routes share it)."""
    if is_ollama_path(request.path):
        return ollama_error(body)
    if is_anthropic_path(request.path):
        return anthropic_error(body, status)
    return body


async def read_rest_of_body(response):
    """An error may be answered before its request body has arrived (a 401 from the auth check).

    Hypercorn then drops the keep-alive connection without saying so, under a client that may
    already be sending its next request there ("Server disconnected without sending a response",
    3 in 3000 requests). Reading the rest keeps the connection usable; a body too large or too
    slow to read gets `Connection: close`, which clients heed.
    """
    if response.status_code < 400:
        return response
    if response.status_code in (408, 413):
        response.headers["Connection"] = "close"
        return response
    try:
        await request.get_data(cache=False)
    except HTTPException:
        response.headers["Connection"] = "close"
    return response


def registry_for(settings: Settings) -> Registry:
    """The --model folders and the default model first, then --models-dir, HF cache, LM
    Studio."""
    from ..engine.models.naming import model_id_for

    pinned = []
    for source in (settings.model, *settings.models):
        served = Path(source).expanduser()
        if served.is_dir():
            pinned.append((served.resolve(), model_id_for(source), "command line"))
    pinned.append((DEFAULT_MODEL, DEFAULT_MODEL.name, "default"))
    return Registry(pinned, models_dirs=[Path(d) for d in settings.models_dirs])
