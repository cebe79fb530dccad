"""JSON-schema plumbing for the request models, so /openapi.json states what the server accepts:
every alias, the `null` that means a default, the shapes pydantic's types cannot say, and examples
fuzzers start from."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from ..sampling.params import DEFAULT_SAMPLERS, SAMPLER_ALIASES, SAMPLER_LETTERS

# JSON-schema facts the request models' validators enforce, written out for /openapi.json.
MAX_STOP_STRINGS = 16
MAX_LOGIT_BIAS = 100.0
KNOWN_SAMPLERS = (*DEFAULT_SAMPLERS, "infill")
STOP_SCHEMA = {
    "anyOf": [
        {"type": "string"},
        {"type": "array", "items": {"type": "string"}, "maxItems": MAX_STOP_STRINGS},
        {"type": "null"},
    ]
}
_BIAS = {
    "anyOf": [
        {"type": "number", "minimum": -MAX_LOGIT_BIAS, "maximum": MAX_LOGIT_BIAS},
        {"const": False, "description": "never this token"},
    ]
}
LOGIT_BIAS_SCHEMA = {
    "anyOf": [
        {
            "type": "object",
            "description": "token id (or llama.cpp: text, each of its tokens) -> bias",
            "additionalProperties": _BIAS,
        },
        {
            "type": "array",
            "description": "llama.cpp's pairs: [token id or text, bias or false]",
            "items": {
                "type": "array",
                "prefixItems": [{"anyOf": [{"type": "integer"}, {"type": "string"}]}, _BIAS],
                "minItems": 2,
                "maxItems": 2,
            },
        },
        {"type": "null"},
    ]
}
_TOKEN_ID = {"type": "integer", "minimum": 0}
_PIECES = {  # one prompt: token ids, or llama.cpp's mix of text and ids
    "type": "array",
    "minItems": 1,
    "items": {"anyOf": [{"type": "string"}, _TOKEN_ID]},
}
PROMPT_SCHEMA = {
    "anyOf": [
        {"type": "string"},
        _PIECES,
        {"type": "array", "minItems": 1, "items": {"type": "string"}},  # several prompts
        {"type": "array", "minItems": 1, "items": _PIECES},  # several, as ids
    ]
}
SAMPLER_NAMES = sorted({*KNOWN_SAMPLERS, *SAMPLER_ALIASES})
SAMPLERS_SCHEMA = {
    "anyOf": [
        {"type": "array", "items": {"enum": SAMPLER_NAMES}},
        {"type": "string", "pattern": f"^[{''.join(sorted(SAMPLER_LETTERS))}]*$"},
        {"type": "null"},
    ]
}


def documented(*examples: dict[str, Any]):
    """A request model's `json_schema_extra` hook. The model names the fields where `null` means
    the default through its `null_is_default()` classmethod."""

    def extra(schema: dict[str, Any], model: type[BaseModel]) -> None:
        properties = schema.get("properties", {})
        for name in model.null_is_default() & properties.keys():
            allow_null(properties[name])
        document_aliases(schema, model)
        if examples:
            schema["examples"] = list(examples)

    return extra


def allow_null(prop: dict[str, Any]) -> None:
    """`"n": null` means the default (OpenAI's clients send it): say so in the schema."""
    meta = {"title", "description", "default", "examples"}
    core = {k: prop.pop(k) for k in list(prop) if k not in meta}
    branches = core["anyOf"] if list(core) == ["anyOf"] else [core]
    if {"type": "null"} not in branches:
        branches = [*branches, {"type": "null"}]
    prop["anyOf"] = branches


def document_aliases(schema: dict[str, Any], model: type[BaseModel]) -> None:
    """Every name a field accepts appears in the JSON schema, so /openapi.json lists
    `n_predict`, `repeat_penalty`, `mirostat_lr`... beside the canonical name."""
    properties = schema.get("properties", {})
    for name, info in model.model_fields.items():
        choices = info.validation_alias.choices if info.validation_alias else []
        names = [name, *(c for c in choices if isinstance(c, str))]
        shown = next((n for n in names if n in properties), None)
        if shown is None:
            continue
        for other in names:
            if other not in properties:
                properties[other] = {
                    **properties[shown],
                    "title": other,
                    "description": f"Alias of `{shown}`.",
                }
