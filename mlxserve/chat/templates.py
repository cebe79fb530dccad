"""Messages -> the prompt text the model was trained on.

The model's own chat template renders it (mlx-lm's TokenizerWrapper, which runs transformers'
sandboxed Jinja); a model without one gets ChatML, as llama.cpp does, logged once. Templates that
do not know tools or tool calls get them written in Hermes' form (see tool_prompt.py), so every
model can be offered tools and read its earlier calls back.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass
from typing import Any

from jinja2 import TemplateError as JinjaError

from ..families import OutputFormat, output_format
from ..settings import ChatSettings
from .tool_calls import parser_name
from .tool_prompt import as_plain_messages, with_tools_described

log = logging.getLogger("mlxserve.chat")

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CHATML_END = "<|im_end|>"
# Names the renderer sets itself; chat_template_kwargs may not override them.
RESERVED_KWARGS = frozenset(
    {
        "messages",
        "conversation",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "return_dict",
    }
)


class TemplateError(ValueError):
    """The chat template refused the messages; the message is the template's reason."""


@dataclass(frozen=True)
class TemplateInfo:
    """What a model's template can render by itself."""

    fallback: bool  # the model has none: ChatML stands in
    tools: bool  # reads `tools`
    tool_calls: bool  # renders assistant `tool_calls` and `tool` messages
    developer: bool  # knows the `developer` role (else it becomes `system`)
    output: OutputFormat | None = None  # the family's own output format mlx-lm does not read


_infos: weakref.WeakKeyDictionary[Any, TemplateInfo] = weakref.WeakKeyDictionary()


def template_info(tokenizer: Any, override: str | None = None) -> TemplateInfo:
    """The abilities of the template in use (`override`, the --chat-template text, or the
    model's own), read once per loaded tokenizer from its source text."""
    if override is not None:
        return _abilities(override)
    info = _infos.get(tokenizer)
    if info is None:
        info = _read_template(tokenizer)
        _infos[tokenizer] = info
        if info.fallback:
            log.warning("the model has no chat template; chat uses ChatML (<|im_start|> roles)")
    return info


def template_text(tokenizer: Any, override: str | None = None) -> str:
    """The Jinja text chat renders with: `override` (--chat-template's), else the model's
    ("" for none; a model's named templates: its default one)."""
    if override is not None:
        return override
    source: Any = getattr(tokenizer, "chat_template", None)
    if isinstance(source, dict):
        source = source.get("default", next(iter(source.values()), ""))
    return source if isinstance(source, str) else ""


def _read_template(tokenizer: Any) -> TemplateInfo:
    if not getattr(tokenizer, "has_chat_template", False):
        return TemplateInfo(fallback=True, tools=False, tool_calls=False, developer=False)
    source = getattr(tokenizer, "chat_template", None)
    if isinstance(source, dict):  # named templates ("default", "tool_use"): any of them
        source = "\n".join(str(s) for s in source.values())
    if not isinstance(source, str):  # mlx-lm's own renderer for the family: trusted whole
        return TemplateInfo(fallback=False, tools=True, tool_calls=True, developer=True)
    return _abilities(source)


def _abilities(source: str) -> TemplateInfo:
    return TemplateInfo(
        fallback=False,
        tools="tools" in source,
        tool_calls="tool_calls" in source,
        developer="developer" in source,
        output=output_format(source),
    )


def writes_reasoning(tokenizer: Any, override: str | None = None) -> bool:
    """Whether the model's answers carry reasoning the server reads apart from content: tags
    mlx-lm found in its vocabulary, or its family's own (families.py)."""
    own = template_info(tokenizer, override).output
    return bool(getattr(tokenizer, "has_thinking", False)) or (own is not None and own.reasons)


def render(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    template_kwargs: dict[str, Any] | None = None,
    override: str | None = None,
) -> str:
    """The prompt text for `messages` (plain dicts: role, content as a string, tool_calls with
    arguments as objects), in the model's template or `override` (Jinja text). TemplateError
    when the template refuses them."""
    info = template_info(tokenizer, override)
    if not info.developer:
        messages = [_developer_as_system(m) for m in messages]
    if tools and not info.tools:
        messages, tools = with_tools_described(messages, tools), None
    if not info.tool_calls:
        messages = as_plain_messages(messages)
    options: dict[str, Any] = dict(template_kwargs or {})
    renderer = tokenizer
    if override is not None:
        options["chat_template"] = override
        # mlx-lm's own renderers for a family take no template: transformers' Jinja does.
        renderer = getattr(tokenizer, "_tokenizer", tokenizer)
    elif info.fallback:
        options["chat_template"] = CHATML

    def apply(messages: list[dict[str, Any]]) -> str:
        try:
            text = renderer.apply_chat_template(
                messages,
                tools=tools or None,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                tokenize=False,
                **options,
            )
        except (JinjaError, TypeError, ValueError, KeyError, IndexError, AttributeError) as error:
            raise TemplateError(str(error) or type(error).__name__) from error
        if not isinstance(text, str):
            raise TemplateError("the chat template did not render text")
        return text

    try:
        return apply(messages)
    except TemplateError:
        folded = system_folded(messages)
        if folded == messages:
            raise
        # a template that takes a system turn only first (Mistral's, Gemma's) gets the later
        # ones inside the user turns; if it refuses that too, the first refusal stands
        try:
            return apply(folded)
        except TemplateError:
            pass
        raise


def system_folded(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """System messages after the conversation's start folded into the next user turn (the last
    user turn when none follows; a user turn of their own after an assistant's), and those at
    its start merged into one."""
    out: list[dict[str, Any]] = []
    pending: list[str] = []
    for message in messages:
        if message["role"] == "system":
            text = message.get("content") or ""
            if all(m["role"] == "system" for m in out):
                out = [
                    {"role": "system", "content": "\n\n".join([*(m["content"] for m in out), text])}
                ]
            else:
                pending.append(text)
            continue
        if pending and message["role"] == "user":
            message = {**message, "content": "\n\n".join([*pending, message.get("content") or ""])}
            pending = []
        out.append(message)
    if pending:
        if out and out[-1]["role"] == "user":
            last = out[-1]
            out[-1] = {**last, "content": "\n\n".join([last.get("content") or "", *pending])}
        else:
            out.append({"role": "user", "content": "\n\n".join(pending)})
    return out


def _developer_as_system(message: dict[str, Any]) -> dict[str, Any]:
    return {**message, "role": "system"} if message["role"] == "developer" else message


def prompt_ids(tokenizer: Any, text: str) -> list[int]:
    """The rendered text's token ids: special-token text in it becomes those tokens (the template
    wrote them), and the tokenizer's BOS leads once, whether or not the template wrote it."""
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    ends = set(getattr(tokenizer, "eos_token_ids", ()) or ())
    leading = [t for t in tokenizer.encode("") if t not in ends]
    if leading and ids[: len(leading)] != leading:
        ids = leading + ids
    return ids


def chat_capabilities(tokenizer: Any, chat: ChatSettings) -> dict[str, Any]:
    """What /v1/models says of the loaded model's chat: whose template, and how it calls tools."""
    info = template_info(tokenizer, chat.template)
    if chat.template is not None:
        source = f"--chat-template {chat.template_source}"
    else:
        source = "chatml (fallback)" if info.fallback else "model"
    return {
        "chat_template": source,
        "tools": "template" if info.tools else "system prompt (hermes)",
        "tool_parser": parser_name(tokenizer, chat.tool_parser),
        "thinking": bool(getattr(tokenizer, "has_thinking", False)),
    }


def image_placeholder(tokenizer: Any) -> str | None:
    """The text the tokenizer's chat template writes for one image part (Qwen's
    `<|vision_start|><|image_pad|><|vision_end|>`, Gemma 3's `<start_of_image>`): the user turn
    rendered with an image before a marker, less the same turn without it. None where the
    template writes nothing for an image, or cannot render parts."""
    marker = "\u2063mlxserve-marker\u2063"

    def turn(parts: list[dict[str, Any]]) -> str:
        messages = [{"role": "user", "content": [*parts, {"type": "text", "text": marker}]}]
        return tokenizer.apply_chat_template(messages, tokenize=False)

    try:
        with_image, without = turn([{"type": "image"}]), turn([])
    except Exception:  # a template for text alone: content parts are not its input
        return None
    head = without.split(marker)[0]
    if marker not in with_image or not with_image.startswith(head):
        return None
    return with_image[len(head) : with_image.index(marker)] or None
