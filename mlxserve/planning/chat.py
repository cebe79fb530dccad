"""A chat request -> what the shared planning step takes: the rendered prompt's token ids, the
stops its template needs, the one output constraint (response_format and the like, or a forced
tool call), and how the answer is read back (reasoning, tool calls)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..api.constraints import NamedToolChoice, constraint_of
from ..api.errors import InvalidRequest
from ..api.openai.chat_protocol import ChatCompletionRequest
from ..api.protocol import CompletionRequest
from ..chat.output import THINK_TAGS, OutputSpec
from ..chat.templates import CHATML_END, TemplateError, prompt_ids, render, template_info
from ..chat.tool_calls import forced_call_grammar, forced_call_schema, syntax_for
from ..sampling.grammars import Constraint
from ..settings import ChatSettings


@dataclass(frozen=True)
class ChatPrompt:
    request: CompletionRequest  # for planning: the prompt as token ids
    constraint: Constraint | None
    output: OutputSpec
    text: str  # the rendered prompt


def prepare(body: ChatCompletionRequest, tokenizer: Any, chat: ChatSettings) -> ChatPrompt:
    """Render the messages with the model's template (or --chat-template's) and plan how its
    answer is read."""
    tools = _offered_tools(body)
    calling = bool(tools) and body.tool_choice != "none"
    forced = calling and body.tool_choice not in (None, "auto")
    try:
        text = render(
            tokenizer,
            body.template_messages(),
            tools,
            add_generation_prompt=body.generation_prompt,
            continue_final_message=body.continue_final_message,
            template_kwargs=template_kwargs(body),
            override=chat.template,
        )
    except TemplateError as error:
        raise InvalidRequest(
            f"The model's chat template refused these messages: {error}",
            param="messages",
            code="invalid_messages",
        ) from error
    think = _think_tags(body.reasoning_format or chat.reasoning_format, tokenizer)
    syntax = syntax_for(tokenizer, tools, chat.tool_parser) if calling else None
    if forced and not syntax.json_body:
        syntax = None  # the forced calls are bare JSON: a syntax of JSON in tags is needed
    output = OutputSpec(
        think=think,
        thinking_open=think is not None and _opens_thinking(text, think),
        tools=syntax,
        json_calls=calling and not forced,
        forced=forced,
        max_calls=None if body.parallel_tool_calls else 1,
    )
    changes: dict[str, Any] = {}
    if template_info(tokenizer, chat.template).fallback and CHATML_END not in body.stop_strings:
        changes["stop"] = [*body.stop_strings, CHATML_END]
    if _markers_are_special(tokenizer, output):
        changes["skip_special_tokens"] = False  # else the tags vanish from the text
    request = body.completion_request(prompt_ids(tokenizer, text), **changes)
    constraint = _constraint(body, request, tools, output if forced else None)
    return ChatPrompt(request, constraint, output, text)


def _offered_tools(body: ChatCompletionRequest) -> list[dict[str, Any]] | None:
    tools = body.template_tools()
    choice = body.tool_choice
    if isinstance(choice, NamedToolChoice):
        name = choice.function.get("name")
        if not any(t["function"]["name"] == name for t in tools or []):
            raise InvalidRequest(
                f"tool_choice names the function {name!r}, which is not among the tools.",
                param="tool_choice",
            )
    elif choice == "required" and not tools:
        raise InvalidRequest("tool_choice 'required' needs tools.", param="tool_choice")
    return tools


def _constraint(
    body: ChatCompletionRequest,
    request: CompletionRequest,
    tools: list[dict[str, Any]] | None,
    forced: OutputSpec | None,
) -> Constraint | None:
    """response_format (or any completions constraint), or the forced calls' grammar: in the
    model's syntax where its calls are JSON in tags (Hermes, Qwen), else as bare JSON."""
    other = constraint_of(request)
    if forced is None:
        return other
    if other is not None:
        raise InvalidRequest(
            f"Only one output constraint per request: tool_choice forces a call, and "
            f"'{other.field}' constrains the answer too.",
            param=other.field,
            code="conflicting_parameters",
        )
    choice = body.tool_choice
    if isinstance(choice, NamedToolChoice):
        tools = [t for t in tools or [] if t["function"]["name"] == choice.function.get("name")]
    one = isinstance(choice, NamedToolChoice) or not body.parallel_tool_calls
    if forced.tools is not None:
        grammar = forced_call_grammar(tools or [], one, forced.tools)
        return Constraint("tool_choice", "lark", grammar)
    schema = forced_call_schema(tools or [], one)
    return Constraint("tool_choice", "json_schema", json.dumps(schema, sort_keys=True))


def _think_tags(reasoning_format: str, tokenizer: Any) -> tuple[str, str] | None:
    if reasoning_format == "none":
        return None
    if getattr(tokenizer, "has_thinking", False):
        return tokenizer.think_start, tokenizer.think_end
    return THINK_TAGS


def _opens_thinking(text: str, think: tuple[str, str]) -> bool:
    """The generation prompt opens the thinking block itself (DeepSeek-R1, GLM): the answer
    starts inside it."""
    return text.rstrip().endswith(think[0])


def _markers_are_special(tokenizer: Any, output: OutputSpec) -> bool:
    markers = [*(output.think or ())]
    if output.tools is not None:
        markers += [output.tools.start, output.tools.end]
    special = set(getattr(tokenizer, "all_special_tokens", None) or ())
    return any(m in special for m in markers if m)


def template_kwargs(body: ChatCompletionRequest) -> dict | None:
    """chat_template_kwargs, with OpenAI's reasoning_effort where they do not set one."""
    if body.reasoning_effort is None:
        return body.chat_template_kwargs
    return {"reasoning_effort": body.reasoning_effort, **(body.chat_template_kwargs or {})}
