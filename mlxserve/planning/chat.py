"""A chat request -> what the shared planning step takes: the rendered prompt's token ids, the
stops its template needs, the one output constraint (response_format and the like, or a forced
tool call), and how the answer is read back (reasoning, tool calls). Every chat door (OpenAI
chat, Ollama, Anthropic, Responses) prepares its canonical request here."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from typing import Any

from ..api.errors import InvalidRequest
from ..chat.forced_calls import (
    MISTRAL,
    QWEN3_CODER,
    harmony_grammar,
    mistral_grammar,
    xml_grammar,
)
from ..chat.harmony import MARKERS as HARMONY_MARKERS
from ..chat.output import THINK_TAGS, OutputSpec
from ..chat.templates import CHATML_END, TemplateError, prompt_ids, render, template_info
from ..chat.tool_calls import ToolSyntax, forced_call_grammar, forced_call_schema, syntax_for
from ..families import OutputFormat
from ..sampling.grammars import Constraint
from ..settings import ChatSettings
from .messages import Message
from .model_facts import ModelFacts
from .request import Chat, NamedTool, Request


@dataclass(frozen=True)
class ChatPrompt:
    request: Request  # for planning: the prompt as token ids, the constraint settled
    output: OutputSpec
    text: str  # the rendered prompt


def prepare(request: Request, model: ModelFacts, settings: ChatSettings) -> ChatPrompt:
    """Render the messages with the model's template (or --chat-template's) and plan how its
    answer is read; the conversation's images read (a model that takes none: a 400, but for
    tools' results, whose images it is told were left out)."""
    chat = request.chat
    tokenizer = model.tokenizer
    if chat.has_tool_images and not model.takes_images:
        chat = chat.tool_images_left_out()
    _refuse_images_of_a_text_model(chat, model)
    tools = _offered_tools(chat)
    calling = bool(tools) and chat.tool_choice != "none"
    forced = calling and chat.tool_choice not in (None, "auto")

    def rendered(chat: Chat) -> str:
        return render(
            tokenizer,
            chat.template_messages(),
            tools,
            add_generation_prompt=chat.generation_prompt,
            continue_final_message=chat.continue_final_message,
            template_kwargs=chat.template_kwargs,
            override=settings.template,
        )

    try:
        try:
            text = rendered(chat)
            placed = _places_every_image(text, chat, model)
        except TemplateError:
            if not chat.has_tool_images:
                raise
            placed = False
        if not placed:
            # a template that reads a tool's turn as text alone: its images are left out
            chat = chat.tool_images_left_out()
            text = rendered(chat)
    except TemplateError as error:
        raise InvalidRequest(
            f"The model's chat template refused these messages: {error}",
            param="messages",
            code="invalid_messages",
        ) from error
    images, image_tokens = read_image_parts(chat.images(), model, settings)
    own = template_info(tokenizer, settings.template).output
    reasoning_format = chat.reasoning_format or settings.reasoning_format
    harmony = own is not None and own.channels  # its channels hold its reasoning and calls
    think = None if harmony else _think_tags(reasoning_format, tokenizer, own)
    syntax = None
    if calling and not harmony:
        family_syntax = own.tool_syntax if own is not None else None
        syntax = syntax_for(tokenizer, tools, settings.tool_parser, family_syntax)
    if forced and syntax is not None and not _forced_in_syntax(syntax):
        syntax = None  # the forced calls are bare JSON
    output = OutputSpec(
        think=think,
        thinking_open=think is not None and _opens_thinking(text, think),
        tools=syntax,
        json_calls=calling and not forced and not harmony,
        forced=forced,
        max_calls=None if chat.parallel_tool_calls else 1,
        harmony=harmony,
        reasoning_in_content=harmony and reasoning_format == "none",
    )
    stop, options = request.stop, request.output
    if template_info(tokenizer, settings.template).fallback and CHATML_END not in stop.strings:
        stop = replace(stop, strings=(*stop.strings, CHATML_END))
    if _markers_are_special(tokenizer, output):
        options = replace(options, skip_special_tokens=False)  # else the tags vanish
    special = _special_tokens(tokenizer)
    constraint = _constraint(chat, request.constraint, tools, output if forced else None, special)
    ids = prompt_ids(tokenizer, text)
    checkpoints = ()
    if model.keeps_checkpoints and not images:
        checkpoints = _message_ends(chat, ids, lambda c: prompt_ids(tokenizer, rendered(c)))
    prepared = replace(
        request,
        prompt=ids,
        checkpoints=checkpoints,
        stop=stop,
        output=options,
        constraint=constraint,
        images=images,
        image_tokens=image_tokens,
        images_prompt=text if images else "",
    )
    return ChatPrompt(prepared, output, text)


def _message_ends(chat: Chat, ids: list[int], tokens_of) -> tuple[int, ...]:
    """Where, in the prompt `ids`, the system messages end and the last message ends (before
    the generation prompt): the points a later turn of the same conversation, or another
    conversation under the same system prompt, continues from, whatever the template does
    after them (one that opens the thinking block, or drops earlier reasoning). mlx-lm's
    server keeps the same two. A template that refuses either conversation marks none."""
    ends = set()
    ended = replace(chat, add_generation_prompt=False, continue_final_message=False)
    system = next((i for i, m in enumerate(chat.messages) if m.role != "system"), 0)
    candidates = [ended]
    if system:
        candidates.append(replace(ended, messages=(*chat.messages[:system], _EMPTY_USER)))
    for candidate in candidates:
        try:
            shared = len(os.path.commonprefix([tokens_of(candidate), ids]))
        except TemplateError:
            continue
        if 0 < shared < len(ids) - 1:
            ends.add(shared)
    return tuple(sorted(ends))


_EMPTY_USER = Message(role="user", content="")


def _places_every_image(text: str, chat: Chat, model: ModelFacts) -> bool:
    """Whether the rendered prompt holds a placeholder for each image of a tool's result (a
    template may write a tool's turn as text, whatever its parts)."""
    if not chat.has_tool_images or model.image_placeholder is None:
        return True
    return text.count(model.image_placeholder) >= len(chat.images())


def _refuse_images_of_a_text_model(chat: Chat, model: ModelFacts) -> None:
    """A 400 naming the conversation's first image, where the model takes none."""
    parts = chat.images()
    if parts and not model.takes_images:
        raise InvalidRequest(
            f"The model {model.model_id} does not take images: it is a text model. Send text, "
            "or ask a vision model (a Qwen2-VL, Gemma 3, ... folder, served with the vision "
            "extra: pip install 'mlxserve[vision]').",
            param=f"{parts[0]['param']}",
            code="unsupported_content_type",
        )


def read_image_parts(
    parts: list[dict[str, Any]],
    model: ModelFacts,
    settings: ChatSettings,
    where: str = "messages",
) -> tuple[tuple[bytes, ...], int]:
    """Image parts (`messages.image_part`) read and checked, for a model that takes images:
    their bytes, and the tokens they become in its prompt; a 400 naming the first that fails
    (too many of them: naming `where`)."""
    from ..vision.images import check_count, from_base64, pixel_size
    from ..vision.media import image_from_url

    check_count(len(parts), where)
    images, tokens = [], 0
    for part in parts:
        param = part["param"]
        if "base64" in part:
            data = from_base64(part["base64"], param)
        else:
            data = image_from_url(part["url"], param, settings)
        if model.image_tokens is not None:
            size = pixel_size(data)
            refusal = model.image_tokens.refusal(*size)
            if refusal is not None:
                raise InvalidRequest(f"{param}: {refusal}.", param=param, code="invalid_image")
            tokens += model.image_tokens.count(*size)
        images.append(data)
    return tuple(images), tokens


def _offered_tools(chat: Chat) -> list[dict[str, Any]] | None:
    tools = list(chat.tools) or None
    choice = chat.tool_choice
    if isinstance(choice, NamedTool):
        if not any(t["function"]["name"] == choice.name for t in tools or []):
            raise InvalidRequest(
                f"tool_choice names the function {choice.name!r}, which is not among the tools.",
                param="tool_choice",
            )
    elif choice == "required" and not tools:
        raise InvalidRequest("tool_choice 'required' needs tools.", param="tool_choice")
    return tools


def _constraint(
    chat: Chat,
    other: Constraint | None,
    tools: list[dict[str, Any]] | None,
    forced: OutputSpec | None,
    special: dict[str, int] | None = None,
) -> Constraint | None:
    """The request's own constraint (response_format and the like), or the forced calls'
    grammar: in the model's syntax where a grammar of it is written (harmony, Qwen3-Coder's
    XML, Mistral's, JSON in tags: Hermes, Qwen), else as bare JSON. `special`: the tokenizer's
    special tokens by text, their ids (a grammar names them as tokens)."""
    special = special or {}
    if forced is None:
        return other
    if other is not None:
        raise InvalidRequest(
            f"Only one output constraint per request: tool_choice forces a call, and "
            f"'{other.field}' constrains the answer too.",
            param=other.field,
            code="conflicting_parameters",
        )
    choice = chat.tool_choice
    if isinstance(choice, NamedTool):
        tools = [t for t in tools or [] if t["function"]["name"] == choice.name]
    one = isinstance(choice, NamedTool) or not chat.parallel_tool_calls
    if forced.harmony:
        return Constraint("tool_choice", "lark", harmony_grammar(tools or [], special))
    if forced.tools is not None:
        written = FAMILY_GRAMMARS.get(forced.tools.name)
        if written is not None:
            grammar = written(tools or [], one, special)
        else:
            grammar = forced_call_grammar(tools or [], one, forced.tools, special)
        return Constraint("tool_choice", "lark", grammar)
    schema = forced_call_schema(tools or [], one)
    return Constraint("tool_choice", "json_schema", json.dumps(schema, sort_keys=True))


# the families' syntaxes a forced call is held to by a grammar of its own (forced_calls.py)
FAMILY_GRAMMARS = {QWEN3_CODER: xml_grammar, MISTRAL: mistral_grammar}


def _forced_in_syntax(syntax: ToolSyntax) -> bool:
    """A forced call can be held to this syntax by a grammar of it."""
    return syntax.json_body or syntax.name in FAMILY_GRAMMARS


def _special_tokens(tokenizer: Any) -> dict[str, int]:
    texts = getattr(tokenizer, "all_special_tokens", None) or ()
    ids = getattr(tokenizer, "all_special_ids", None) or ()
    return dict(zip(texts, ids))


def _think_tags(
    reasoning_format: str, tokenizer: Any, own: OutputFormat | None
) -> tuple[str, str] | None:
    if reasoning_format == "none":
        return None
    if own is not None and own.think is not None:
        return own.think
    if getattr(tokenizer, "has_thinking", False):
        return tokenizer.think_start, tokenizer.think_end
    return THINK_TAGS


def _opens_thinking(text: str, think: tuple[str, str]) -> bool:
    """The generation prompt opens the thinking block itself (DeepSeek-R1, GLM): the answer
    starts inside it."""
    return text.rstrip().endswith(think[0])


def _markers_are_special(tokenizer: Any, output: OutputSpec) -> bool:
    markers = [*(output.think or ()), *(HARMONY_MARKERS if output.harmony else ())]
    if output.tools is not None:
        markers += [output.tools.start, output.tools.end]
    special = set(getattr(tokenizer, "all_special_tokens", None) or ())
    return any(m in special for m in markers if m)
