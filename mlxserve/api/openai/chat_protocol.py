"""POST /v1/chat/completions' request: the options OpenAI's doors share (protocol.py's
GenerationOptions: sampling, stop, output, constraints) with `messages`, OpenAI's chat logprobs
(`logprobs: true` + `top_logprobs`), vLLM's template options, tools and llama.cpp's
`reasoning_format`; translated once into the canonical request, the conversation's rules
checked there (planning/messages.py)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    field_validator,
    model_validator,
)

from ...chat.templates import RESERVED_KWARGS
from ...planning.defaults import logprobs_k
from ...planning.messages import ROLES, Call, Message, check_messages
from ...planning.request import Chat, NamedTool, Request
from ..constraints import NamedToolChoice, constraint_of
from ..errors import FieldError
from ..protocol import LIMITED_FIELDS, MAX_TOKENS_FIELD, GenerationOptions, alias
from ..schema_docs import documented

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

    def to_message(self) -> Message:
        calls = tuple(
            Call(call.function.name, call.function.arguments, call.id)
            for call in self.tool_calls or ()
        )
        return Message(
            role=self.role,
            content=self.content,
            name=self.name,
            tool_calls=calls,
            tool_call_id=self.tool_call_id,
            reasoning_content=self.reasoning_content,
        )


class ChatCompletionRequest(GenerationOptions):
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
    limited_fields: ClassVar[dict[str, str]] = {
        **LIMITED_FIELDS,
        "top_logprobs": "max_top_logprobs",
    }

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
        return self

    def to_request(self) -> Request:
        """The canonical request: the conversation (its rules checked), the tools offered to
        the template, and the constraint of any dialect's fields."""
        choice = self.tool_choice
        chat = Chat(
            messages=check_messages([m.to_message() for m in self.messages]),
            tools=tuple(t.model_dump(exclude_none=True) for t in self.tools or ()),
            tool_choice=NamedTool(choice.function.get("name"))
            if isinstance(choice, NamedToolChoice)
            else choice,
            parallel_tool_calls=self.parallel_tool_calls,
            add_generation_prompt=self.add_generation_prompt,
            continue_final_message=self.continue_final_message,
            template_kwargs=self._template_kwargs(),
            reasoning_format=self.reasoning_format,
        )
        return self._request(
            logprobs=logprobs_k(self.logprobs, self.top_logprobs),
            constraint=constraint_of(self, calls=False),
            chat=chat,
        )

    def _template_kwargs(self) -> dict[str, Any] | None:
        """chat_template_kwargs, with OpenAI's reasoning_effort where they do not set one."""
        if self.reasoning_effort is None:
            return self.chat_template_kwargs
        return {"reasoning_effort": self.reasoning_effort, **(self.chat_template_kwargs or {})}


_CHAT_NULL_IS_DEFAULT = frozenset(
    {"continue_final_message", "parallel_tool_calls", "reasoning_format"}
)
