"""Turning a request body into a validated model, or an error that names the field in our words
(not pydantic's); fields no request model declares are named back to the client."""

from __future__ import annotations

import functools
import json
import logging
import re
from typing import Any, TypeVar
from urllib.parse import quote

from pydantic import BaseModel, ValidationError
from quart import current_app, g, has_request_context, request

from ..settings import Limits
from . import access_log
from .errors import APIError, FieldError, InvalidRequest
from .llamacpp.protocol import InfillRequest, NativeCompletionRequest
from .log_once import FirstSight
from .openai.chat_protocol import ChatCompletionRequest
from .protocol import CompletionRequest, GenerationOptions

Model = TypeVar("Model", bound=BaseModel)
log = logging.getLogger("mlxserve.api")

# Bodies we read as JSON: JSON itself, none given, what `curl -d` and Python's urllib send by
# default (form encoding) and what a browser's fetch() sends a string body as (text/plain).
JSON_BODY_TYPES = ("", "application/json", "text/plain", "application/x-www-form-urlencoded")

# Every dialect's request model: a field one of them declares (or an alias of it) is not unknown
# on another route; the client sent a real field to the wrong dialect, not a misspelling.
DIALECT_MODELS = (CompletionRequest, NativeCompletionRequest, InfillRequest, ChatCompletionRequest)
UNKNOWN_FIELDS_HEADER = "X-Unknown-Fields"
MAX_NAMED_UNKNOWN = 16  # in one response's header
_unknown_seen = FirstSight()

# What a JSON value must be, by pydantic's error type: our words, with pydantic's `ctx` values.
REQUIREMENTS = {
    "string_type": "must be a string",
    "int_type": "must be an integer",
    "float_type": "must be a number",
    "bool_type": "must be true or false",
    "list_type": "must be a list",
    "dict_type": "must be an object",
    "model_type": "must be an object",
    "model_attributes_type": "must be an object",
    "none_required": "must be null",
    "finite_number": "must be a finite number",
    "literal_error": "must be one of {expected}",
    "enum": "must be one of {expected}",
    "greater_than": "must be greater than {gt}",
    "greater_than_equal": "must be greater than or equal to {ge}",
    "less_than": "must be less than {lt}",
    "less_than_equal": "must be less than or equal to {le}",
    "string_too_short": "must be at least {min_length} character{s} long",
    "string_too_long": "must be at most {max_length} character{s} long",
    "too_short": "must hold at least {min_length} item{s}",
    "too_long": "must hold at most {max_length} item{s}",
}
# A literal's choices as JSON spells them (pydantic gives Python's).
JSON_CONSTANTS = {"True": "true", "False": "false", "None": "null"}
PYTHON_CONSTANTS = re.compile(r"\b(?:True|False|None)\b")
# The names pydantic gives a union's branches in an error's location (`stop.list[str]`).
BRANCH_TYPES = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})


async def read_json_object() -> dict[str, Any]:
    """The request's body as a JSON object, or a 4xx saying what is wrong with it."""
    mimetype = request.mimetype
    if mimetype not in JSON_BODY_TYPES and not mimetype.endswith("+json"):
        raise APIError(
            f"Unsupported Content-Type {mimetype!r}: send the JSON body as application/json "
            "(any +json type, text/plain, form encoding or no Content-Type are read as JSON too).",
            code="unsupported_media_type",
            status=415,
        )
    body = await request.get_data()
    access_log.note_body(body)
    return parse_json_object(body)


async def read_completion_request(
    model: type[GenerationOptions] = CompletionRequest,
) -> GenerationOptions:
    """A completion or chat route's body (`model`: its request class), validated against this
    server's limits."""
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
    """`data` as a `model`, or a 400 naming the first invalid field."""
    try:
        body = model.model_validate(data, context={"limits": limits})
    except ValidationError as error:
        raise refusal(error) from error
    note_unknown_fields(sorted(unknown_fields(body)))
    return body


def refusal(error: ValidationError) -> InvalidRequest:
    """The 400 for the first invalid field: its name, what it must be, and what it was."""
    errors = error.errors()
    rule = errors[0].get("ctx", {}).get("error")
    if isinstance(rule, FieldError):
        return InvalidRequest(rule.message, param=rule.param, code=rule.code)
    # A union's branches each report an error: the deepest one's place is where the value went
    # wrong, and what each branch accepts there is what it must be.
    field = errors[0]["loc"][:1]
    siblings = [e for e in errors if e["loc"][:1] == field]
    place = max((_place(e["loc"]) for e in siblings), key=len)
    at_place = [e for e in siblings if _place(e["loc"]) == place]
    param = ".".join(str(part) for part in place) or None
    if at_place[0]["type"] == "missing":
        return InvalidRequest(
            f"Missing required field '{param}'.", param=param, code="missing_field"
        )
    message = _either([_requirement(e) for e in at_place])
    if at_place[0].get("input") is not None and " got " not in message:
        message = f"{message} (got {_short(at_place[0]['input'])})"
    return InvalidRequest(
        f"Invalid value for '{param}': {message}" if param else message,
        param=param,
        code="invalid_value",
    )


def _place(loc: tuple[int | str, ...]) -> tuple[int | str, ...]:
    """An error's location without pydantic's names for union branches."""
    return tuple(part for part in loc if not _is_branch(part))


def _is_branch(part: int | str) -> bool:
    if isinstance(part, int):
        return False
    return part in BRANCH_TYPES or "[" in part or "-" in part or part[:1].isupper()


def _requirement(error: dict[str, Any]) -> str:
    template = REQUIREMENTS.get(error["type"])
    if template is not None:
        ctx = {name: _plain(value) for name, value in error.get("ctx", {}).items()}
        ctx["s"] = "" if ctx.get("min_length", ctx.get("max_length")) == 1 else "s"
        if error["type"] == "literal_error":
            ctx["expected"] = PYTHON_CONSTANTS.sub(
                lambda m: JSON_CONSTANTS[m.group()], ctx["expected"]
            )
            if ", " not in ctx["expected"]:
                return f"must be {ctx['expected']}"
        return template.format(**ctx)
    if error["type"] in ("value_error", "assertion_error"):
        return _our_words(str(error["ctx"]["error"]))  # a validator's own message
    return _our_words(error["msg"])


def _plain(value: Any) -> Any:
    """A bound or choice as a client writes it: 0 not 0.0; 'a', 'b', 'c' not 'a', 'b' or 'c'."""
    if isinstance(value, float):
        return f"{value:g}"
    return value.replace(" or ", ", ") if isinstance(value, str) else value


def _our_words(message: str) -> str:
    """A message in pydantic's phrasing ("Input should be ..."), ours ("must be ...")."""
    prefix = "Input should be "
    return "must be " + message[len(prefix) :] if message.startswith(prefix) else message


def _either(requirements: list[str]) -> str:
    """One requirement from a union's: "must be a string or a list"."""
    unique = list(dict.fromkeys(requirements))
    prefix = "must be "
    if len(unique) > 1 and all(r.startswith(prefix) for r in unique):
        alternatives = [r[len(prefix) :] for r in unique]
        return prefix + ", ".join(alternatives[:-1]) + " or " + alternatives[-1]
    return unique[0]


def _short(value: Any, limit: int = 80) -> str:
    text = json.dumps(value) if value is None or isinstance(value, bool) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def unknown_fields(body: BaseModel) -> set[str]:
    """The body's fields that no dialect's model declares, aliases included."""
    return set(body.model_extra or {}) - _declared_names()


@functools.cache
def _declared_names() -> frozenset[str]:
    names = set()
    for model in DIALECT_MODELS:
        for name, info in model.model_fields.items():
            alias = info.validation_alias
            names.update([name, *(alias.choices if alias is not None else [])])
    return frozenset(names)


def note_unknown_fields(names: list[str]) -> None:
    """Log each unknown field's name once per process (INFO), and keep this request's for the
    response's X-Unknown-Fields header: a misspelled field is ignored, but not silently."""
    for name in names:
        if _unknown_seen.first(name):
            log.info(
                "Unknown field %r in a request body: ignored (each name is logged once; the "
                "response's %s header names them every time)",
                name,
                UNKNOWN_FIELDS_HEADER,
            )
    if names and has_request_context():
        g.unknown_fields = names


def unknown_fields_header(names: list[str]) -> str:
    """The header's value: the names, comma-separated, URL-encoded where they are not plain."""
    shown = [quote(name, safe="") for name in names[:MAX_NAMED_UNKNOWN]]
    if len(names) > MAX_NAMED_UNKNOWN:
        shown.append(f"...({len(names) - MAX_NAMED_UNKNOWN} more)")
    return ", ".join(shown)
