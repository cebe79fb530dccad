"""Turning a request body into a validated model, or an error that names the field."""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from quart import current_app, request

from ..sampling.params import DEFAULT_SAMPLERS, SAMPLER_ALIASES, SAMPLER_LETTERS
from ..settings import Limits
from .errors import APIError, InvalidRequest
from .schemas import NOT_YET_SUPPORTED, CompletionRequest

Model = TypeVar("Model", bound=BaseModel)

# Bodies we read as JSON: JSON itself, none given, and what `curl -d` and simple clients send.
JSON_BODY_TYPES = ("", "application/json", "text/plain", "application/x-www-form-urlencoded")


async def read_json_object() -> dict[str, Any]:
    """The request's body as a JSON object, or a 4xx saying what is wrong with it."""
    mimetype = request.mimetype
    if mimetype not in JSON_BODY_TYPES and not mimetype.endswith("+json"):
        raise APIError(
            f"Unsupported Content-Type {mimetype!r}: send the body as application/json.",
            code="unsupported_media_type",
            status=415,
        )
    return parse_json_object(await request.get_data())


async def read_completion_request(
    model: type[CompletionRequest] = CompletionRequest,
) -> CompletionRequest:
    """A completion route's body, validated against this server's limits."""
    data = await read_json_object()
    return parse_completion_request(data, model, current_app.config["SETTINGS"].limits)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON (numbers must be finite)")


def _number(text: str) -> float | int:
    """JSON Schema counts 2.0 as an integer: so do we (float fields take ints as they are)."""
    value = float(text)
    return int(value) if value.is_integer() else value


def parse_json_object(body: bytes) -> dict[str, Any]:
    """The body as a JSON object. The request models are strict (no `true` for 1, no "0.5"
    for 0.5): JSON's own types, as /openapi.json states them."""
    try:
        data = json.loads(body, parse_constant=_no_constant, parse_float=_number)
    except (ValueError, UnicodeDecodeError) as error:
        raise InvalidRequest(
            f"We could not parse the JSON body of your request: {error}", code="invalid_json"
        ) from error
    except RecursionError as error:
        raise InvalidRequest(
            "The JSON body of your request is nested too deeply.", code="invalid_json"
        ) from error
    if not isinstance(data, dict):
        raise InvalidRequest("The request body must be a JSON object.", code="invalid_json")
    _check_unicode(data)
    return data


def _check_unicode(data: Any) -> None:
    """JSON may escape lone surrogates (\\udc80): text no tokenizer can take. Refuse them here."""
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as error:
                raise InvalidRequest(
                    f"The JSON body holds text that is not valid Unicode: {error.reason} "
                    f"({item[error.start : error.end]!a}).",
                    code="invalid_json",
                ) from error


def validate(model: type[Model], data: dict[str, Any], limits: Limits | None = None) -> Model:
    try:
        return model.model_validate(data, context={"limits": limits})
    except ValidationError as error:
        first = error.errors()[0]
        param = ".".join(str(part) for part in first["loc"]) or None
        message = first["msg"]
        if first.get("input") is not None and first["type"] not in ("missing",):
            message = f"{message} (got {_short(first['input'])})"
        raise InvalidRequest(
            f"Invalid value for '{param}': {message}" if param else message,
            param=param,
            code="invalid_value" if first["type"] != "missing" else "missing_field",
        ) from error


def parse_completion_request(
    data: dict[str, Any],
    model: type[CompletionRequest] = CompletionRequest,
    limits: Limits | None = None,
) -> CompletionRequest:
    """A completion body of any route (`model`: its request class) after the checks that span
    several fields."""
    for name, off_values in NOT_YET_SUPPORTED.items():
        if name in data and not any(data[name] is off for off in off_values):
            raise InvalidRequest(
                f"'{name}' is not supported by this server yet; remove it or send its default.",
                param=name,
                code="unsupported_parameter",
            )
    request = validate(model, data, limits)
    if request.best_of is not None and request.best_of < request.n:
        raise InvalidRequest(
            f"best_of ({request.best_of}) must be at least n ({request.n}).", param="best_of"
        )
    if request.stream and request.best_of is not None and request.best_of > request.n:
        raise InvalidRequest(
            "best_of > n cannot be streamed: the best choices are known only at the end.",
            param="best_of",
        )
    if request.max_tokens is not None and 0 < request.max_tokens < request.min_tokens:
        raise InvalidRequest(
            f"min_tokens ({request.min_tokens}) must not exceed max_tokens ({request.max_tokens}).",
            param="min_tokens",
        )
    if request.dry_multiplier > 0 and request.dry_base < 1:
        raise InvalidRequest(
            f"dry_base must be at least 1 when DRY is on (dry_multiplier > 0), got "
            f"{request.dry_base}.",
            param="dry_base",
        )
    sampler_names(request.samplers)  # raises on unknown names
    return request


def sampler_names(samplers: list[str] | str | None) -> tuple[str, ...]:
    """llama.cpp's `samplers`: a list of names, or a string of one-letter codes."""
    if samplers is None:
        return DEFAULT_SAMPLERS
    names = [SAMPLER_LETTERS.get(c, c) for c in samplers] if isinstance(samplers, str) else samplers
    names = [SAMPLER_ALIASES.get(n, n) for n in names]
    known = {*DEFAULT_SAMPLERS, "infill"}
    for name in names:
        if name not in known:
            raise InvalidRequest(
                f"Unknown sampler {name!r} in 'samplers'; known: {', '.join(DEFAULT_SAMPLERS)} "
                f"(or llama.cpp's letters {''.join(SAMPLER_LETTERS)}).",
                param="samplers",
            )
    return tuple(names)


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
