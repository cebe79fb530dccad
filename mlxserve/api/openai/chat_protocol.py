"""POST /v1/chat/completions' request: the completions request model with `messages` in place of
`prompt`, OpenAI's chat logprobs (`logprobs: true` + `top_logprobs`), vLLM's template options,
tools and llama.cpp's `reasoning_format`. Every sampling field, alias and rule is inherited."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema

from ...chat.templates import RESERVED_KWARGS
from ...planning.defaults import logprobs_k
from ...settings import Limits
from ..errors import FieldError
from ..protocol import MAX_TOKENS_FIELD, CompletionRequest, alias
from ..schema_docs import documented

ROLES = ("system", "developer", "user", "assistant", "tool")
MEDIA_PARTS = ("image_url", "image", "input_image", "input_audio", "audio", "file", "video_url")
MAX_TOP_LOGPROBS = 20  # OpenAI's bound; --max-top-logprobs may set a lower one
NOT_CHAT_FIELDS = {
    "prompt": "chat takes `messages`; send a raw prompt to /v1/completions.",
    "suffix": "fill-in-the-middle is /v1/completions' `suffix` or llama.cpp's /infill.",
    "echo": "chat does not echo its prompt; /v1/completions does.",
}


class ToolCallFunction(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1)
    arguments: str | dict[str, Any] = "{}"


class MessageToolCall(BaseModel):
    """A call an earlier assistant turn made, sent back with the conversation."""

    model_config = ConfigDict(extra="allow")
    id: str | None = None
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str = Field(json_schema_extra={"enum": list(ROLES)})  # checked by check_messages
    content: str | list[dict[str, Any]] | None = Field(
        None, description="a string, or a list of {'type': 'text', 'text': ...} parts"
    )
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = Field(
        None, validation_alias=alias("reasoning_content", "reasoning")
    )

    def text(self) -> str:
        """The content as one string (a list's text parts joined; checked to be text)."""
        if isinstance(self.content, list):
            # an assistant's refusal part (OpenAI's) reads as the text it is
            return "".join(part.get("text", part.get("refusal", "")) for part in self.content)
        return self.content or ""

    def for_template(self) -> dict[str, Any]:
        """What chat templates read: content a string, call arguments an object."""
        message: dict[str, Any] = {"role": self.role, "content": self.text()}
        if self.name is not None:
            message["name"] = self.name
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        if self.reasoning_content is not None:
            message["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            message["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {
                        "name": call.function.name,
                        "arguments": _arguments(call.function.arguments),
                    },
                }
                for call in self.tool_calls
            ]
        return message


def _arguments(arguments: str | dict[str, Any]) -> dict[str, Any]:
    return json.loads(arguments) if isinstance(arguments, str) else arguments


class ChatCompletionRequest(CompletionRequest):
    """POST /v1/chat/completions in OpenAI's, vLLM's and llama.cpp's names."""

    model_config = ConfigDict(
        json_schema_extra=documented(
            {"messages": [{"role": "user", "content": "Hello!"}], "temperature": 0},
            {
                "messages": [{"role": "user", "content": "Hi"}],
                "stream": True,
                "stream_options": {"include_usage": True},
                "logprobs": True,
                "top_logprobs": 2,
            },
            {
                "messages": [{"role": "user", "content": "A user as JSON"}],
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "user", "schema": {"type": "object"}},
                },
            },
        )
    )

    messages: list[ChatMessage]
    max_tokens: StrictInt | None = Field(
        None,
        ge=-1,
        le=MAX_TOKENS_FIELD,
        validation_alias=alias("max_completion_tokens", "max_tokens", "n_predict"),
        description="max_completion_tokens or max_tokens; null or -1: until the model ends its "
        "turn or the context window is full",
    )
    logprobs: StrictBool | None = Field(
        None, description="each generated token's logprob in choices[].logprobs.content"
    )
    top_logprobs: StrictInt | None = Field(
        None, ge=0, le=MAX_TOP_LOGPROBS, description="alternatives per token (logprobs: true)"
    )
    add_generation_prompt: StrictBool | None = Field(
        None, description="vLLM: open the assistant's turn (default: unless continuing)"
    )
    continue_final_message: StrictBool = Field(
        False, description="vLLM: the answer continues the last (assistant) message"
    )
    chat_template_kwargs: dict[str, Any] | None = Field(
        None, description="vLLM: extra template variables, e.g. {'enable_thinking': false}"
    )
    parallel_tool_calls: StrictBool = True
    reasoning_effort: str | None = Field(
        None,
        description="OpenAI's: passed to the template as reasoning_effort (chat_template_kwargs "
        "wins if it sets one), as /v1/responses passes reasoning.effort",
    )
    reasoning_format: Literal["auto", "deepseek", "none"] | None = Field(
        None,
        description="llama.cpp: 'none' keeps <think> text inline in content; otherwise it goes "
        "to reasoning_content (default: the server's --reasoning-format)",
    )
    prompt: SkipJsonSchema[Any] = None
    suffix: SkipJsonSchema[Any] = None
    echo: SkipJsonSchema[Any] = False

    @model_validator(mode="before")
    @classmethod
    def _screen_chat(cls, data: Any) -> Any:
        """Completions' prompt fields are not chat's; say where they belong."""
        if not isinstance(data, dict):
            return data
        for name, where in NOT_CHAT_FIELDS.items():
            if data.get(name) not in (None, False):
                raise FieldError(
                    f"'{name}' is not a chat field: {where}", param=name, code="invalid_field"
                )
        return {k: v for k, v in data.items() if not (v is None and k in _CHAT_NULL_IS_DEFAULT)}

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs_limit(cls, value: int | None, info: ValidationInfo) -> int | None:
        limit = ((info.context or {}).get("limits") or Limits()).max_top_logprobs
        if value is not None and value > limit:
            raise ValueError(f"must be less than or equal to {limit} (this server's limit)")
        return value

    @field_validator("chat_template_kwargs")
    @classmethod
    def _own_names(cls, kwargs: dict[str, Any] | None) -> dict[str, Any] | None:
        taken = sorted(RESERVED_KWARGS & (kwargs or {}).keys())
        if taken:
            raise FieldError(
                f"chat_template_kwargs may not set {', '.join(taken)}: use the request's own "
                "fields.",
                param="chat_template_kwargs",
            )
        return kwargs

    @model_validator(mode="after")
    def _chat_rules(self) -> ChatCompletionRequest:
        if not self.messages:
            raise FieldError("messages must hold at least one message.", param="messages")
        if self.top_logprobs is not None and not self.logprobs:
            raise FieldError(
                "top_logprobs needs logprobs: true.", param="top_logprobs", code="invalid_value"
            )
        if self.continue_final_message and self.add_generation_prompt:
            raise FieldError(
                "continue_final_message continues the last message; add_generation_prompt "
                "opens a new one. Send one of them.",
                param="add_generation_prompt",
            )
        if self.continue_final_message and self.messages[-1].role != "assistant":
            raise FieldError(
                "continue_final_message needs an assistant message last.",
                param="continue_final_message",
            )
        check_messages(self.messages)
        return self

    @property
    def generation_prompt(self) -> bool:
        if self.add_generation_prompt is None:
            return not self.continue_final_message
        return self.add_generation_prompt

    @property
    def top_k_logprobs(self) -> int | None:
        """The engine's logprobs: None (off), or how many alternatives per token."""
        return logprobs_k(self.logprobs, self.top_logprobs)

    def template_messages(self) -> list[dict[str, Any]]:
        return [m.for_template() for m in self.messages]

    def template_tools(self) -> list[dict[str, Any]] | None:
        if not self.tools:
            return None
        return [t.model_dump(exclude_none=True) for t in self.tools]

    def completion_request(self, prompt_ids: list[int], **changes: Any) -> CompletionRequest:
        """The shared request planning takes: this one's fields, the rendered prompt's ids, and
        the engine's logprobs. `changes` are the chat door's own (stop strings, say)."""
        fields = {name: getattr(self, name) for name in CompletionRequest.model_fields}
        fields.update(
            prompt=prompt_ids,
            suffix=None,
            echo=False,
            logprobs=self.top_k_logprobs,
            tools=None,
            tool_choice=None,
            **changes,
        )
        return CompletionRequest.model_construct(**fields)


def check_messages(messages: list[ChatMessage]) -> None:
    """Roles, text-only content, and tool results that answer a call: each a 400 naming the
    message's field."""
    calls: set[str | None] | None = None  # ids of the last assistant turn's calls
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if message.role not in ROLES:
            raise FieldError(
                f"Unknown role {message.role!r} in {where}; roles are {', '.join(ROLES)}.",
                param=f"{where}.role",
            )
        _check_content(message, where)
        if message.role == "tool":
            _check_tool_result(message, where, calls)
        elif message.role == "assistant" and message.tool_calls:
            _check_calls(message, where)
            calls = {call.id for call in message.tool_calls}
        else:
            calls = None


def _check_content(message: ChatMessage, where: str) -> None:
    content = message.content
    if content is None:
        if message.role != "assistant":
            raise FieldError(f"{where}.content is required.", param=f"{where}.content")
        return
    if isinstance(content, str):
        return
    for j, part in enumerate(content):
        kind = part.get("type")
        if kind == "text" and isinstance(part.get("text"), str):
            continue
        if kind == "refusal" and isinstance(part.get("refusal"), str):
            continue
        param = f"{where}.content[{j}]"
        if kind in MEDIA_PARTS:
            raise FieldError(
                f"Content part type '{kind}' is not supported: this server runs text models "
                "only. Send text parts.",
                param=f"{param}.type",
                code="unsupported_content_type",
            )
        if kind == "text":
            raise FieldError(f"{param}.text must be a string.", param=f"{param}.text")
        raise FieldError(
            f"Unknown content part type {kind!r} in {param}; send {{'type': 'text', 'text': ...}}.",
            param=f"{param}.type",
        )


def _check_calls(message: ChatMessage, where: str) -> None:
    for j, call in enumerate(message.tool_calls or []):
        arguments = call.function.arguments
        if isinstance(arguments, str):
            try:
                parsed = json.loads(arguments) if arguments.strip() else {}
            except ValueError as error:
                raise FieldError(
                    f"{where}.tool_calls[{j}].function.arguments is not JSON: {error}",
                    param=f"{where}.tool_calls[{j}].function.arguments",
                ) from error
            if not isinstance(parsed, dict):
                raise FieldError(
                    f"{where}.tool_calls[{j}].function.arguments must be a JSON object.",
                    param=f"{where}.tool_calls[{j}].function.arguments",
                )
            call.function.arguments = parsed


def _check_tool_result(message: ChatMessage, where: str, calls: set[str | None] | None) -> None:
    if calls is None:
        raise FieldError(
            f"{where} is a tool result, but no assistant message with tool_calls comes before "
            "it. Send the assistant's tool_calls turn first.",
            param=f"{where}.role",
        )
    if message.tool_call_id is None:
        raise FieldError(f"{where}.tool_call_id is required.", param=f"{where}.tool_call_id")
    if None not in calls and message.tool_call_id not in calls:
        raise FieldError(
            f"{where}.tool_call_id {message.tool_call_id!r} answers none of the calls before it "
            f"({', '.join(sorted(calls))}).",
            param=f"{where}.tool_call_id",
        )


_CHAT_NULL_IS_DEFAULT = frozenset(
    {"continue_final_message", "parallel_tool_calls", "reasoning_format"}
)
