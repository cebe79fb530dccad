"""Turning a request body into a validated model, or an error that names the field."""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from quart import current_app, request

from ..settings import Limits
from .errors import APIError, FieldError, InvalidRequest
from .protocol import CompletionRequest

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
    """A completion route's body (`model`: its request class), validated against this server's
    limits."""
    data = await read_json_object()
    return validate(model, data, current_app.config["SETTINGS"].limits)


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
    """`data` as a `model`, or a 400 naming the first field at fault."""
    try:
        return model.model_validate(data, context={"limits": limits})
    except ValidationError as error:
        first = error.errors()[0]
        rule = first.get("ctx", {}).get("error")
        if isinstance(rule, FieldError):
            raise InvalidRequest(rule.message, param=rule.param, code=rule.code) from error
        param = ".".join(str(part) for part in first["loc"]) or None
        message = first["msg"]
        if first.get("input") is not None and first["type"] not in ("missing",):
            message = f"{message} (got {_short(first['input'])})"
        raise InvalidRequest(
            f"Invalid value for '{param}': {message}" if param else message,
            param=param,
            code="invalid_value" if first["type"] != "missing" else "missing_field",
        ) from error


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
