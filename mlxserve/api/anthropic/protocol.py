"""Anthropic's Messages API request shapes: messages of content blocks (text, tool_use,
tool_result, thinking), tools with input schemas, tool_choice, thinking and stop sequences."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt

from ...planning.defaults import no_parameters
from ..protocol import MAX_TOKENS_FIELD

MAX_STOP_SEQUENCES = 16


class TextBlock(BaseModel):
    model_config = ConfigDict(extra="allow")  # cache_control, citations: accepted
    type: Literal["text"]
    text: str


class ToolUseBlock(BaseModel):
    """A call an earlier assistant turn made."""

    model_config = ConfigDict(extra="allow")
    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: dict[str, Any] = Field(default_factory=dict)


class ToolResultBlock(BaseModel):
    """A call's result, in the user turn after it."""

    model_config = ConfigDict(extra="allow")
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: str | list[dict[str, Any]] = ""
    is_error: StrictBool = False


class ThinkingBlock(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["redacted_thinking"]


class MediaBlock(BaseModel):
    """Images (a user's, for a vision model; in a tool's result, a line saying it was left
    out) and documents (refused by name, or left out of a tool's result)."""

    model_config = ConfigDict(extra="allow")
    type: Literal["image", "document", "search_result", "container_upload"]


ContentBlock = Annotated[
    TextBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock | MediaBlock,
    Field(discriminator="type"),
]


class Message(BaseModel):
    """A turn. `system` is accepted anywhere (Anthropic's beta mid-conversation-system, which
    Claude Code sends for its agent and skill lists), with or without that beta header."""

    model_config = ConfigDict(extra="allow")
    role: Literal["user", "assistant", "system"]
    content: str | list[ContentBlock]


class ToolDefinition(BaseModel):
    """A client tool. Anthropic's server tools (web search, code execution, ...) carry a
    versioned `type` and are refused by name."""

    model_config = ConfigDict(extra="allow")
    type: str | None = None
    name: str = Field(min_length=1, max_length=128)
    description: str | None = None
    input_schema: dict[str, Any] = Field(default_factory=no_parameters)


class ToolChoice(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: StrictBool = False


class Thinking(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["enabled", "disabled", "adaptive", "between_tools"]
    budget_tokens: StrictInt | None = Field(None, ge=0)


class OutputFormat(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(BaseModel):
    """Structured output (`format`) and `effort` (passed to the template as reasoning_effort)."""

    model_config = ConfigDict(extra="allow")
    format: OutputFormat | None = None
    effort: str | None = None


class CountTokensRequest(BaseModel):
    """POST /v1/messages/count_tokens: what a message request would put in the prompt."""

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={
            "examples": [{"model": "any", "messages": [{"role": "user", "content": "Hello"}]}]
        },
    )

    model: str = Field(max_length=1024, description="any name: the served model answers")
    messages: list[Message] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None


class MessagesRequest(CountTokensRequest):
    """POST /v1/messages."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "model": "any",
                    "max_tokens": 64,
                    "messages": [{"role": "user", "content": "Hello"}],
                },
                {
                    "model": "any",
                    "max_tokens": 64,
                    "system": "Answer in JSON.",
                    "messages": [{"role": "user", "content": "Weather in Oslo?"}],
                    "tools": [
                        {
                            "name": "get_weather",
                            "input_schema": {
                                "type": "object",
                                "properties": {"city": {"type": "string"}},
                            },
                        }
                    ],
                    "tool_choice": {"type": "any"},
                    "stream": True,
                },
            ]
        }
    )

    max_tokens: StrictInt = Field(ge=1, le=MAX_TOKENS_FIELD)
    stop_sequences: list[str] | None = Field(None, max_length=MAX_STOP_SEQUENCES)
    temperature: StrictFloat | None = Field(
        None, ge=0.0, le=1.0, description="older API versions' sampling fields, still honoured"
    )
    top_p: StrictFloat | None = Field(None, gt=0.0, le=1.0)
    top_k: StrictInt | None = Field(None, ge=0)
    stream: StrictBool = False
    metadata: dict[str, Any] | None = None
