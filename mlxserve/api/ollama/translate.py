"""Ollama's requests as the shared ones: options onto the sampler, `format` onto one constraint,
messages (tool results matched to calls by name) onto OpenAI chat's. Planning, the engine and the
reading of answers are then the other front doors'."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from ...planning.defaults import logprobs_k
from ...planning.request import Request
from ...sampling.grammars import Constraint
from ...settings import Limits
from ..constraints import schema_constraint
from ..errors import InvalidRequest
from ..openai.chat_protocol import ChatCompletionRequest
from ..parsing import validate
from ..protocol import CompletionRequest
from .protocol import ChatRequest, GenerateRequest, GenerationFields, OllamaMessage


def refuse_unsupported(body: GenerateRequest | ChatRequest) -> None:
    """Images and Go template overrides: a clear 400 rather than an answer that ignored them."""
    images = getattr(body, "images", None)
    if images:
        raise InvalidRequest(
            "images are not supported: this server runs text models only.", param="images"
        )
    for i, message in enumerate(getattr(body, "messages", [])):
        if message.images:
            raise InvalidRequest(
                "images are not supported: this server runs text models only.",
                param=f"messages[{i}].images",
            )
    if getattr(body, "template", None):
        raise InvalidRequest(
            "template overrides are not supported: the model's own chat template (or the "
            "server's --chat-template) renders the prompt. Send raw: true with a prompt you "
            "templated yourself.",
            param="template",
        )


def format_constraint(fmt: str | dict[str, Any] | None) -> Constraint | None:
    """`format`: "json" is any JSON object; a schema is followed; "" or none is free text."""
    if not fmt:
        return None
    return schema_constraint("format", {"type": "object"} if fmt == "json" else fmt)


def _shared_fields(body: GenerationFields, filling: bool) -> dict[str, Any]:
    """Sampling with Ollama's defaults and names; a prompt that does not fit is cut from the
    front, as Ollama cuts it (a FIM prompt is fitted by the FIM builder instead)."""
    options = body.sampling_options
    fields = options.sampling_fields()
    fields["context_length_exceeded_behavior"] = "truncate"
    if options.num_ctx is not None and not filling:
        fields["truncate_prompt_tokens"] = options.num_ctx
    return fields


def completion_request(body: GenerateRequest, limits: Limits) -> Request:
    """/api/generate with `raw` or a `suffix`: the prompt as it is, or the model's FIM prompt
    around the cursor; a `context` from an earlier answer goes first."""
    filling = bool(body.suffix)
    prompt: Any = body.prompt
    if body.context:
        prompt = [*body.context, body.prompt] if body.prompt else list(body.context)
    fields = {
        "prompt": prompt,
        "suffix": body.suffix or None,
        "logprobs": logprobs_k(body.logprobs, body.top_logprobs),
        **_shared_fields(body, filling),
    }
    request = validate(CompletionRequest, fields, limits).to_request()
    return replace(request, constraint=format_constraint(body.format))


def generate_as_chat(body: GenerateRequest, limits: Limits) -> Request:
    """/api/generate otherwise: `system` and `prompt` rendered by the model's chat template."""
    messages = [{"role": "system", "content": body.system}] if body.system else []
    messages.append({"role": "user", "content": body.prompt})
    return _chat(body, messages, None, limits)


def chat_request(body: ChatRequest, limits: Limits) -> Request:
    """/api/chat's messages and tools in OpenAI chat's shapes."""
    tools = [tool.model_dump(exclude_none=True) for tool in body.tools] if body.tools else None
    return _chat(body, openai_messages(body.messages), tools, limits)


def _chat(
    body: GenerationFields, messages: list[dict], tools: list | None, limits: Limits
) -> Request:
    fields: dict[str, Any] = {
        "messages": messages,
        "tools": tools,
        "logprobs": body.logprobs,
        "top_logprobs": body.top_logprobs if body.logprobs else None,
        **_shared_fields(body, filling=False),
    }
    if body.think is False:
        fields["chat_template_kwargs"] = {"enable_thinking": False}
    elif isinstance(body.think, str):
        fields["chat_template_kwargs"] = {"reasoning_effort": body.think}
    request = validate(ChatCompletionRequest, fields, limits).to_request()
    return replace(request, constraint=format_constraint(body.format))


def openai_messages(messages: list[OllamaMessage]) -> list[dict[str, Any]]:
    """Ollama's messages as OpenAI chat's. Ollama's calls carry no ids and its tool results
    name the tool: each result answers the first unanswered call of that name (else the
    first unanswered call) of the assistant turn before it."""
    out: list[dict[str, Any]] = []
    unanswered: list[tuple[str, str]] = []  # (id, name) of the last assistant turn's calls
    last_id: str | None = None
    for i, message in enumerate(messages):
        converted: dict[str, Any] = {"role": message.role, "content": message.content}
        if message.thinking:
            converted["reasoning_content"] = message.thinking
        if message.role == "assistant" and message.tool_calls:
            calls = []
            for j, call in enumerate(message.tool_calls):
                call_id = call.id or f"call_{i}_{j}"
                arguments = call.function.arguments
                calls.append(
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {
                            "name": call.function.name,
                            "arguments": arguments
                            if isinstance(arguments, str)
                            else json.dumps(arguments),
                        },
                    }
                )
            converted["tool_calls"] = calls
            unanswered = [(c["id"], c["function"]["name"]) for c in calls]
            last_id = calls[-1]["id"]
        elif message.role == "tool":
            converted["tool_call_id"] = message.tool_call_id or _answered(
                unanswered, message.tool_name, last_id
            )
            if message.tool_name:
                converted["name"] = message.tool_name
        out.append(converted)
    return out


def _answered(unanswered: list[tuple[str, str]], name: str | None, last_id: str | None):
    for k, (call_id, call_name) in enumerate(unanswered):
        if name is None or call_name == name:
            del unanswered[k]
            return call_id
    if unanswered:
        return unanswered.pop(0)[0]
    return last_id
