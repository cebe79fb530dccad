"""Ollama's requests as the canonical one: options onto the sampler (Ollama's defaults under
them), `format` onto one constraint, messages (tool results matched to calls by name) onto the
shared messages. Planning, the engine and the reading of answers are then the other doors'."""

from __future__ import annotations

from typing import Any

from ...engine import StopSpec
from ...planning.defaults import OLLAMA_NUM_KEEP, kept_tokens, logprobs_k, until_full
from ...planning.messages import Call, Message, check_messages, image_part
from ...planning.request import Chat, ContextFit, Output, Request
from ...sampling.grammars import Constraint
from ..constraints import schema_constraint
from ..errors import InvalidRequest
from .protocol import ChatRequest, GenerateRequest, GenerationFields, OllamaMessage


def refuse_unsupported(body: GenerateRequest | ChatRequest) -> None:
    """Go template overrides, and images in a raw or infill prompt (which no template places):
    a clear 400 rather than an answer that ignored them."""
    if getattr(body, "images", None) and (
        getattr(body, "raw", False) or getattr(body, "suffix", None)
    ):
        raise InvalidRequest(
            "images go with a templated prompt: send them without raw or suffix.", param="images"
        )
    if getattr(body, "template", None):
        raise InvalidRequest(
            "template overrides are not supported: the model's own chat template (or the "
            "server's --chat-template) renders the prompt. Send raw: true with a prompt you "
            "templated yourself.",
            param="template",
        )


def _with_images(content: Any, images: list[Any] | None, where: str) -> Any:
    """Ollama's message with `images` (base64) as content parts: the images first, then the
    text, as Ollama puts them before the message's text."""
    if not images:
        return content
    parts = [image_part(data, f"{where}[{k}]", base64=True) for k, data in enumerate(images)]
    if content:
        parts.append({"type": "text", "text": content})
    return parts


def format_constraint(fmt: str | dict[str, Any] | None) -> Constraint | None:
    """`format`: "json" is any JSON object; a schema is followed; "" or none is free text."""
    if not fmt:
        return None
    return schema_constraint("format", {"type": "object"} if fmt == "json" else fmt)


def completion_request(body: GenerateRequest) -> Request:
    """/api/generate with `raw` or a `suffix`: the prompt as it is, or the model's FIM prompt
    around the cursor; a `context` from an earlier answer goes first."""
    prompt: Any = body.prompt
    if body.context:
        prompt = [*body.context, body.prompt] if body.prompt else list(body.context)
    return _request(body, filling=bool(body.suffix), prompt=prompt, suffix=body.suffix or None)


def generate_as_chat(body: GenerateRequest) -> Request:
    """/api/generate otherwise: `system` and `prompt` rendered by the model's chat template."""
    messages = [Message("system", body.system)] if body.system else []
    messages.append(Message("user", _with_images(body.prompt, body.images, "images")))
    return _chat(body, messages, ())


def chat_request(body: ChatRequest) -> Request:
    """/api/chat's messages and tools."""
    tools = tuple(tool.model_dump(exclude_none=True) for tool in body.tools or ())
    return _chat(body, chat_messages(body.messages), tools)


def _chat(
    body: GenerationFields, messages: list[Message], tools: tuple[dict[str, Any], ...]
) -> Request:
    template_kwargs = None
    if body.think is False:
        template_kwargs = {"enable_thinking": False}
    elif isinstance(body.think, str):
        template_kwargs = {"reasoning_effort": body.think}
    chat = Chat(check_messages(messages), tools, template_kwargs=template_kwargs)
    return _request(body, filling=False, chat=chat)


def _request(body: GenerationFields, filling: bool, **door: Any) -> Request:
    """Sampling with Ollama's defaults and names; a prompt that does not fit is cut from the
    front, as Ollama cuts it (a FIM prompt is fitted by the FIM builder instead)."""
    options = body.sampling_options
    return Request(
        sampling=options.sampling(),
        stop=StopSpec(strings=tuple(options.stop or ())),
        model=body.model,
        max_tokens=until_full(options.num_predict),
        seed=options.seed,
        constraint=format_constraint(body.format),
        output=Output(logprobs=logprobs_k(body.logprobs, body.top_logprobs)),
        fit=ContextFit(
            truncate=True,
            keep_last=None if filling else options.num_ctx,
            keep_first=kept_tokens(
                OLLAMA_NUM_KEEP if options.num_keep is None else options.num_keep
            ),
        ),
        **door,
    )


def chat_messages(messages: list[OllamaMessage]) -> list[Message]:
    """Ollama's messages as the shared ones. Ollama's calls carry no ids and its tool results
    name the tool: each result answers the first unanswered call of that name (else the
    first unanswered call) of the assistant turn before it."""
    out: list[Message] = []
    unanswered: list[tuple[str, str]] = []  # (id, name) of the last assistant turn's calls
    last_id: str | None = None
    for i, message in enumerate(messages):
        calls: tuple[Call, ...] = ()
        tool_call_id = None
        if message.role == "assistant" and message.tool_calls:
            calls = tuple(
                Call(call.function.name, call.function.arguments, call.id or f"call_{i}_{j}")
                for j, call in enumerate(message.tool_calls)
            )
            unanswered = [(call.id, call.name) for call in calls]
            last_id = calls[-1].id
        elif message.role == "tool":
            tool_call_id = message.tool_call_id or _answered(unanswered, message.tool_name, last_id)
        out.append(
            Message(
                message.role,
                _with_images(message.content, message.images, f"messages[{i}].images"),
                name=message.tool_name if message.role == "tool" and message.tool_name else None,
                tool_calls=calls,
                tool_call_id=tool_call_id,
                reasoning_content=message.thinking or None,
            )
        )
    return out


def _answered(unanswered: list[tuple[str, str]], name: str | None, last_id: str | None):
    for k, (call_id, call_name) in enumerate(unanswered):
        if name is None or call_name == name:
            del unanswered[k]
            return call_id
    if unanswered:
        return unanswered.pop(0)[0]
    return last_id
