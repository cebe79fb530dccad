"""Every dialect's way of constraining output: its fields' shapes, mapped onto one Constraint.

llama.cpp: `grammar` (GBNF), `json_schema`. mistral.rs: `grammar: {type, value}`, `tools` +
`tool_choice`. OpenAI / Fireworks / llama.cpp: `response_format`. vLLM: `guided_json`,
`guided_regex`, `guided_choice`, `guided_grammar` and `structured_outputs`. One per request.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..planning.defaults import no_parameters
from ..sampling.grammars import Constraint
from .errors import InvalidRequest

if TYPE_CHECKING:
    from .protocol import GenerationOptions


class ResponseFormat(BaseModel):
    """OpenAI's, Fireworks' and llama.cpp's response_format."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    type: Literal["text", "json_object", "json_schema"]
    schema_: dict[str, Any] | None = Field(None, alias="schema")  # Fireworks, llama.cpp
    json_schema: dict[str, Any] | None = None  # OpenAI: {"name", "schema", "strict"}


class TypedGrammar(BaseModel):
    """mistral.rs's grammar: {"type": ..., "value": ...}."""

    type: Literal["regex", "json_schema", "lark", "llguidance"]
    value: str | dict[str, Any]


class StructuredOutputs(BaseModel):
    """vLLM's structured_outputs (the newer spelling of its guided_* fields)."""

    model_config = ConfigDict(extra="allow")
    json_: dict[str, Any] | str | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = Field(None, min_length=1)
    grammar: str | None = None


class ToolFunction(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] = Field(default_factory=no_parameters)


class Tool(BaseModel):
    type: Literal["function"] = "function"
    function: ToolFunction


class NamedToolChoice(BaseModel):
    type: Literal["function"] = "function"
    function: dict[str, str]


def constraint_of(request: GenerationOptions, calls: bool = True) -> Constraint | None:
    """The request's one constraint; two at once is a 400 naming both fields. `calls`: its
    tools + tool_choice force a call (mistral.rs's completions); chat's tools are the template's
    instead (planning/chat.py)."""
    found = [c for c in _candidates(request, calls) if c is not None]
    if len(found) > 1:
        first, second = found[0].field, found[1].field
        raise InvalidRequest(
            f"Only one output constraint per request: got both '{first}' and '{second}'.",
            param=second,
            code="conflicting_parameters",
        )
    return found[0] if found else None


def _candidates(r: GenerationOptions, calls: bool) -> list[Constraint | None]:
    return [
        _grammar(r.grammar),
        schema_constraint("json_schema", r.json_schema) if r.json_schema is not None else None,
        _response_format(r),
        schema_constraint("guided_json", r.guided_json) if r.guided_json is not None else None,
        Constraint("guided_regex", "regex", r.guided_regex) if r.guided_regex else None,
        _choice("guided_choice", r.guided_choice) if r.guided_choice else None,
        Constraint("guided_grammar", "grammar", r.guided_grammar) if r.guided_grammar else None,
        *_structured_outputs(r),
        _tools(r.tools, r.tool_choice) if calls else None,
    ]


def _grammar(grammar) -> Constraint | None:
    if grammar is None or grammar == "":
        return None
    if isinstance(grammar, str):
        return Constraint("grammar", "grammar", grammar)
    if grammar.type == "llguidance":
        value = grammar.value if isinstance(grammar.value, str) else json.dumps(grammar.value)
        return Constraint("grammar", "llguidance", value)
    if grammar.type == "json_schema":
        return schema_constraint("grammar", grammar.value)
    if not isinstance(grammar.value, str):
        raise InvalidRequest(
            f"grammar.value must be a string for type '{grammar.type}'.", param="grammar.value"
        )
    return Constraint("grammar", grammar.type, grammar.value)  # "regex" or "lark"


def schema_constraint(field: str, schema: dict[str, Any] | str) -> Constraint:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as error:
            raise InvalidRequest(f"{field} is not valid JSON: {error}", param=field) from error
    if not isinstance(schema, dict | bool):
        raise InvalidRequest(f"{field} must be a JSON schema object.", param=field)
    return Constraint(field, "json_schema", json.dumps(schema, sort_keys=True))


def _choice(field: str, choices: list[str]) -> Constraint:
    return Constraint(field, "choice", json.dumps(choices))


def _response_format(r: GenerationOptions) -> Constraint | None:
    fmt = r.response_format
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return schema_constraint("response_format", fmt.schema_ or {"type": "object"})
    schema = (fmt.json_schema or {}).get("schema", fmt.schema_)
    if schema is None:
        raise InvalidRequest(
            "response_format of type 'json_schema' needs json_schema.schema.",
            param="response_format.json_schema",
        )
    return schema_constraint("response_format", schema)


def _structured_outputs(r: GenerationOptions) -> list[Constraint | None]:
    so = r.structured_outputs
    if so is None:
        return []
    return [
        schema_constraint("structured_outputs.json", so.json_) if so.json_ is not None else None,
        Constraint("structured_outputs.regex", "regex", so.regex) if so.regex else None,
        _choice("structured_outputs.choice", so.choice) if so.choice else None,
        Constraint("structured_outputs.grammar", "grammar", so.grammar) if so.grammar else None,
    ]


def _tools(tools: list[Tool] | None, choice) -> Constraint | None:
    """A forced (or `required`) tool call: `{"name": ..., "arguments": {...}}` as JSON."""
    if not tools or choice in (None, "none", "auto"):
        return None
    if isinstance(choice, NamedToolChoice):
        name = choice.function.get("name")
        tools = [t for t in tools if t.function.name == name]
        if not tools:
            raise InvalidRequest(
                f"tool_choice names '{name}', which is not among the tools.",
                param="tool_choice",
            )
    calls = [
        {
            "type": "object",
            "properties": {
                "name": {"const": t.function.name},
                "arguments": t.function.parameters,
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for t in tools
    ]
    schema = calls[0] if len(calls) == 1 else {"anyOf": calls}
    return schema_constraint("tools", schema)
