"""The model's tool-call syntax read back into calls.

mlx-lm infers each family's parser from the chat template (Qwen3-Coder XML, Mistral's
[TOOL_CALLS], pythonic, GLM, Kimi, ...) and we use it as is. A model it has no parser for gets
Hermes' <tool_call>{json}</tool_call> (the syntax tool_prompt.py teaches), and a bare JSON answer
(Llama 3.x, or a call the grammar forced) is read as calls too.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import pkgutil
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .forced_calls import literals
from .tool_prompt import CALL_END, CALL_START

PYTHON_TAG = "<|python_tag|>"  # Llama 3.x writes it before a call


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object as text, as OpenAI sends it
    id: str

    def arguments_object(self) -> dict[str, Any]:
        """The arguments as an object (Ollama's and Anthropic's form); {} where they are none."""
        try:
            return json.loads(self.arguments) if self.arguments.strip() else {}
        except ValueError:
            return {}


@dataclass(frozen=True)
class ToolSyntax:
    """Where a call starts and ends in the text (end "" = at the end of the answer), and how
    the text between becomes calls (ValueError when it does not)."""

    start: str
    end: str
    parse: Callable[[str], list[ToolCall]]
    json_body: bool = False  # a call is {"name", "arguments"} JSON between start and end
    name: str = ""  # the parser's (--tool-parser's names)


def call_id() -> str:
    return "call_" + secrets.token_hex(12)


HERMES, DEEPSEEK = "hermes", "deepseek_v31"  # our own parsers' names


def parser_names() -> list[str]:
    """What --tool-parser takes: mlx-lm's parsers by module name (listed, not imported: the
    command line stays quick), and ours (Hermes', DeepSeek's)."""
    spec = importlib.util.find_spec("mlx_lm")
    folders = [str(Path(p) / "tool_parsers") for p in spec.submodule_search_locations or []]
    return sorted({*OWN_SYNTAXES, *(m.name for m in pkgutil.iter_modules(folders))})


def parser_name(tokenizer: Any, override: str | None = None) -> str:
    """The parser in use: `override` (--tool-parser), mlx-lm's pick for the model, or Hermes'."""
    if override is not None:
        return override
    parser = getattr(tokenizer, "tool_parser", None)
    if parser is None or getattr(tokenizer, "tool_call_start", None) is None:
        return HERMES
    return parser.__module__.rsplit(".", 1)[-1]


def syntax_for(
    tokenizer: Any,
    tools: list[dict[str, Any]] | None,
    override: str | None = None,
    family: str | None = None,
) -> ToolSyntax:
    """The syntax of `override` (a --tool-parser name), else the model's own where mlx-lm knows
    it, else the family's where we parse it (`family`: families.py's name for it), else
    Hermes'."""
    if override in OWN_SYNTAXES:
        return OWN_SYNTAXES[override]
    if override is not None:
        module = importlib.import_module(f"mlx_lm.tool_parsers.{override}")
        parser, start = module.parse_tool_call, module.tool_call_start
        end = getattr(module, "tool_call_end", "")
    else:
        parser = getattr(tokenizer, "tool_parser", None)
        start = getattr(tokenizer, "tool_call_start", None)
        end = getattr(tokenizer, "tool_call_end", "")
    if parser is None or start is None:
        return OWN_SYNTAXES.get(family or "", HERMES_SYNTAX)

    def parse(text: str) -> list[ToolCall]:
        try:
            parsed = parser(text, tools)
        except (ValueError, KeyError, TypeError, AttributeError, IndexError) as error:
            raise ValueError(str(error)) from error
        return [_call(c) for c in (parsed if isinstance(parsed, list) else [parsed])]

    name = parser.__module__.rsplit(".", 1)[-1]
    json_body = name == "json_tools" and bool(end)
    return ToolSyntax(start, end or "", parse, json_body=json_body, name=name)


def parse_json_calls(text: str) -> list[ToolCall]:
    """`{"name", "arguments" | "parameters"}` or a list of them, as JSON; ValueError if the
    text is anything else."""
    text = text.strip()
    if text.startswith(PYTHON_TAG):
        text = text[len(PYTHON_TAG) :].strip()
    try:
        payload = json.loads(text)
    except ValueError as error:
        raise ValueError(f"not a JSON tool call: {error}") from error
    calls = payload if isinstance(payload, list) else [payload]
    if not calls:
        raise ValueError("an empty list of tool calls")
    return [_call(c) for c in calls]


HERMES_SYNTAX = ToolSyntax(CALL_START, CALL_END, parse_json_calls, json_body=True, name=HERMES)

# DeepSeek V3 / V3.1's call tokens (mlx-lm has no parser for them)
DEEPSEEK_CALLS_BEGIN, DEEPSEEK_CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
_DEEPSEEK_CALL = re.compile(
    r"<｜tool▁call▁begin｜>(.*?)<｜tool▁sep｜>(.*?)(?:<｜tool▁call▁end｜>|$)", re.S
)
_DEEPSEEK_V3_BODY = re.compile(r"^\s*([^\n]+?)\s*\n```(?:json)?\s*\n(.*?)\n?```\s*$", re.S)


def parse_deepseek_calls(text: str) -> list[ToolCall]:
    """`<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{json}<｜tool▁call▁end｜>` each (V3.1), or V3's
    `function<｜tool▁sep｜>NAME` then its arguments in a json code block."""
    calls = []
    for name, body in _DEEPSEEK_CALL.findall(text):
        name = name.strip()
        fenced = _DEEPSEEK_V3_BODY.match(body) if name == "function" else None
        if fenced is not None:
            name, body = fenced.group(1), fenced.group(2)
        calls.append(_call({"name": name, "arguments": body.strip() or "{}"}))
    if not calls:
        raise ValueError("no DeepSeek tool call")
    return calls


DEEPSEEK_SYNTAX = ToolSyntax(
    DEEPSEEK_CALLS_BEGIN, DEEPSEEK_CALLS_END, parse_deepseek_calls, name=DEEPSEEK
)
# our own parsers, by the name --tool-parser and families.py give them
OWN_SYNTAXES = {HERMES: HERMES_SYNTAX, DEEPSEEK: DEEPSEEK_SYNTAX}


def _call(call: Any) -> ToolCall:
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        raise ValueError(f"not a tool call: {call!r}")
    arguments = call.get("arguments", call.get("parameters", {}))
    if isinstance(arguments, str):
        arguments = json.loads(arguments) if arguments.strip() else {}
    if not isinstance(arguments, dict):
        raise ValueError(f"tool call arguments must be an object, got {arguments!r}")
    given = call.get("id")
    return ToolCall(
        name=call["name"],
        arguments=json.dumps(arguments, ensure_ascii=False),
        id=given if isinstance(given, str) and given else call_id(),
    )


_NAME = re.compile(r'"name"\s*:\s*"((?:[^"\\]|\\.)*)"')
_ARGUMENTS = re.compile(r'"(?:arguments|parameters)"\s*:\s*')


def cut_calls(text: str) -> list[ToolCall]:
    """The calls of a forced answer that max_tokens cut: those whole, then the one cut, with
    its arguments as far as they were written (OpenAI's answer then; Anthropic's tool_use
    block). A call cut before its name was written is none."""
    text = text.strip()
    if text.startswith(PYTHON_TAG):
        text = text[len(PYTHON_TAG) :].strip()
    text = text.removeprefix("[").lstrip()
    calls: list[ToolCall] = []
    decoder = json.JSONDecoder()
    while text:
        try:
            whole, end = decoder.raw_decode(text)
            calls.append(_call(whole))
        except ValueError:
            break
        text = text[end:].lstrip().removeprefix(",").lstrip()
    name = _NAME.search(text)
    if name is None:
        return calls
    arguments = _ARGUMENTS.search(text, name.end())
    partial = text[arguments.end() :] if arguments else ""
    cut_name = json.loads(f'"{name.group(1)}"')
    return [*calls, ToolCall(name=cut_name, arguments=partial, id=call_id())]


def forced_call_grammar(
    tools: list[dict[str, Any]], one: bool, syntax: ToolSyntax, special=None
) -> str:
    """A Lark grammar (llguidance's) for forced calls written the way the model writes them:
    each call's JSON between `syntax`'s start and end, one call (`one`) or several. A tag that
    is one of the tokenizer's `special` tokens (text: id) is named by its id."""
    literal = literals(special or {})

    # spaced as the templates print calls (`tojson`: ", " and ": "), which the model learnt
    spacing = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
    schema = {**forced_call_schema(tools, one=True), "x-guidance": spacing}
    block = f'{literal(syntax.start)} "\\n" %json {json.dumps(schema)} "\\n" '
    block += literal(syntax.end)
    start = "start: call" if one else 'start: call ("\\n" call)*'
    return f"{start}\ncall: {block}\n"


def forced_call_schema(tools: list[dict[str, Any]], one: bool) -> dict[str, Any]:
    """The JSON a forced call must be: one of `tools`' calls (`one`), or a list of them."""
    calls = [
        {
            "type": "object",
            "properties": {
                "name": {"const": tool["function"]["name"]},
                "arguments": tool["function"].get("parameters") or {"type": "object"},
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for tool in tools
    ]
    call = calls[0] if len(calls) == 1 else {"anyOf": calls}
    return call if one else {"type": "array", "items": call, "minItems": 1}
