"""An embedding request's way to its engine: the model made ready (it must be an embedding
model), the inputs' rows embedded, a failure of the batch a clear 500 in the door's shape."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from quart import Response, current_app

from ...engine import EmbeddingFailed, EngineError
from ..dispatch import ready_model
from ..errors import APIError, ServiceUnavailable
from .inputs import input_rows


class EmbeddingError(APIError):
    status = 500
    type = "server_error"


@dataclass
class Embedded:
    # (inputs, dimensions) float32, as the model pooled them; per token, one (tokens,
    # dimensions) array an input
    vectors: np.ndarray | list[np.ndarray]
    tokens: int  # the inputs' tokens (usage)
    loaded: Any  # the model's facts
    engine: Any
    load_ns: int = 0  # the wait for the model (Ollama's load_duration)
    total_ns: int = 0


async def embed(
    model: str | None,
    value: Any,
    param: str = "input",
    truncate=False,
    prompt_name=None,
    per_token: bool = False,
) -> Embedded:
    started = time.perf_counter_ns()
    engine, loaded = await ready_model(model, kind="embed")
    loaded_at = time.perf_counter_ns()
    # tokenizing thousands of inputs must not hold the loop that serves every other stream
    rows, tokens = await asyncio.to_thread(input_rows, value, loaded, param, truncate, prompt_name)
    vectors = await engine_vectors(engine, rows, per_token=per_token)
    done = time.perf_counter_ns()
    return Embedded(vectors, tokens, loaded, engine, loaded_at - started, done - started)


async def engine_vectors(engine, rows: list[list[int]], seconds=None, per_token=False):
    """`engine.embed`'s answer; its failures as the door's errors (a failed batch: 500; an
    engine not there now: 503 with Retry-After)."""
    try:
        return await engine.embed(rows, seconds, per_token)
    except EmbeddingFailed as error:
        raise EmbeddingError(str(error)) from error
    except EngineError as error:
        raise ServiceUnavailable(str(error), headers={"Retry-After": "1"}) from error


async def json_response(build: Callable[[], Any]) -> Response:
    """`build()`'s body as JSON, built and encoded off the event loop (a few thousand vectors
    are tens of megabytes of text: the other streams' chunks would wait for it)."""
    provider = current_app.json
    text = await asyncio.to_thread(lambda: provider.dumps(build()))
    return Response(text, content_type="application/json")
