"""Forced tool calls (`tool_choice` required or named) held by grammar to the family's own
syntax, not to bare JSON: a model writes its own format better than one it was never trained
on. Lark grammars for llguidance; a special token of the tokenizer is named by its id
(`<[200012]>` for gpt-oss's `<|call|>`), other text quoted.

- gpt-oss (harmony): its analysis message if it writes one, then a commentary message to one
  of the tools, `<|constrain|>json`, the arguments its schema allows, `<|call|>`.
- Mistral: `[TOOL_CALLS]NAME[ARGS]` and the arguments its schema allows, a call after another.
- Qwen3-Coder (XML): `<tool_call>`, `<function=NAME>`, each parameter the schema names
  (`<parameter=KEY>`, a string's text as it is, on one line, any other value as JSON),
  `</tool_call>`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

QWEN3_CODER, MISTRAL = "qwen3_coder", "mistral"


def harmony_grammar(tools: list[dict[str, Any]], special: Mapping[str, int]) -> str:
    """One call (harmony ends the answer at `<|call|>`)."""
    token = literals(special)
    calls = " | ".join(
        f'{json.dumps(_name(tool) + " ")} {token("<|constrain|>")} "json" '
        f"{token('<|message|>')} %json {json.dumps(_parameters(tool))}"
        for tool in tools
    )
    return (
        f'start: analysis? {token("<|channel|>")} "commentary to=functions." call '
        f"{token('<|call|>')}\n"
        f'analysis: {token("<|channel|>")} "analysis" {token("<|message|>")} REASONING '
        f'{token("<|end|>")} {token("<|start|>")} "assistant"\n'
        "REASONING: /(.|\\n)*/\n"
        f"call: {calls}\n"
    )


def xml_grammar(tools: list[dict[str, Any]], one: bool, special: Mapping[str, int]) -> str:
    """Qwen3-Coder's calls: one (`one`) or several, a line apart."""
    token = literals(special)
    rules, functions = [], []
    for number, tool in enumerate(tools):
        parameters = _parameters(tool)
        required = set(parameters.get("required") or ())
        pieces = []
        for key, schema in (parameters.get("properties") or {}).items():
            value = "STRING" if schema.get("type") == "string" else f"%json {json.dumps(schema)}"
            opening = json.dumps(f"<parameter={key}>\n")
            piece = f'{opening} {value} "\\n</parameter>\\n"'
            pieces.append(piece if key in required else f"({piece})?")
        functions.append(f"function{number}")
        body = " ".join(pieces)
        opening = json.dumps(f"<function={_name(tool)}>\n")
        rules.append(f'function{number}: {opening} {body} "</function>\\n"')
    start = "start: call" if one else 'start: call ("\\n" call)*'
    return "\n".join(
        [
            start,
            f'call: {token("<tool_call>")} "\\n" ({" | ".join(functions)}) {token("</tool_call>")}',
            *rules,
            # one line without `<` (a value that runs on would eat the newline before its
            # closing tag: the lexer does not give characters back)
            "STRING: /[^<\\n]*/",
        ]
    )


def mistral_grammar(tools: list[dict[str, Any]], one: bool, special: Mapping[str, int]) -> str:
    """Mistral's calls: one (`one`) or several, each `[TOOL_CALLS]NAME[ARGS]{json}`."""
    token = literals(special)
    calls = " | ".join(
        f"{json.dumps(_name(tool))} {token('[ARGS]')} %json {json.dumps(_parameters(tool))}"
        for tool in tools
    )
    start = "start: call" if one else "start: call+"
    return f"{start}\ncall: {token('[TOOL_CALLS]')} ({calls})\n"


def literals(special: Mapping[str, int]):
    """`text` -> how a grammar writes it: a special token (text: id) by its id, else quoted."""

    def literal(text: str) -> str:
        return f"<[{special[text]}]>" if text in special else json.dumps(text)

    return literal


def _name(tool: dict[str, Any]) -> str:
    return tool["function"]["name"]


def _parameters(tool: dict[str, Any]) -> dict[str, Any]:
    return tool["function"].get("parameters") or {"type": "object"}
