"""The embedding doors' request shapes (unknown fields accepted and ignored, as elsewhere)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    field_validator,
)

from ..ollama.protocol import keep_alive_seconds
from ..schema_docs import documented

MAX_NAME = 4096


class Fields(BaseModel):
    @classmethod
    def null_is_default(cls) -> frozenset[str]:
        return frozenset()


class OllamaFields(Fields):
    """What Ollama's two embedding routes share: the model's name and how long it stays."""

    model: str = Field(..., min_length=1, max_length=MAX_NAME)
    keep_alive: StrictFloat | str | None = Field(
        None, description='seconds or "5m" the model stays loaded; negative = forever'
    )
    options: dict[str, Any] | None = None

    @field_validator("keep_alive")
    @classmethod
    def _seconds(cls, value: float | str | None) -> float | None:
        return keep_alive_seconds(value)


class EmbeddingRequest(Fields):
    """POST /v1/embeddings (OpenAI; llama.cpp's and vLLM's OpenAI route the same)."""

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra=documented(
            {"model": "all-MiniLM-L6-v2", "input": ["first text", "second text"]},
            {"input": [[101, 7592, 102]], "encoding_format": "base64"},
        ),
    )
    input: Any = Field(
        ..., description="a string, a list of strings, a list of token ids, or lists of them"
    )
    model: str | None = Field(None, max_length=MAX_NAME)
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: StrictInt | None = Field(
        None, ge=1, description="cut each vector to its first N (Matryoshka models only)"
    )
    user: str | None = Field(None, max_length=MAX_NAME)
    prompt_name: str | None = Field(
        None, max_length=MAX_NAME, description="the model's instruction to put before each text"
    )


class OllamaEmbedRequest(OllamaFields):
    """POST /api/embed (Ollama)."""

    model_config = ConfigDict(
        extra="allow", json_schema_extra=documented({"model": "all-minilm", "input": "why?"})
    )
    input: Any = None
    truncate: StrictBool = True
    dimensions: StrictInt | None = Field(None, ge=1)
    prompt_name: str | None = Field(None, max_length=MAX_NAME)


class OllamaEmbeddingsRequest(OllamaFields):
    """POST /api/embeddings (Ollama's older route: one prompt, one vector, not normalised)."""

    model_config = ConfigDict(
        extra="allow", json_schema_extra=documented({"model": "all-minilm", "prompt": "why?"})
    )
    prompt: str = ""


class NativeEmbeddingRequest(Fields):
    """POST /embedding and /embeddings (llama.cpp's own shape)."""

    model_config = ConfigDict(
        extra="allow", json_schema_extra=documented({"content": "Hello", "embd_normalize": 2})
    )
    content: Any = None
    input: Any = None
    model: str | None = Field(None, max_length=MAX_NAME)
    pooling: Literal["none"] | None = Field(
        None,
        description="\"none\": every token's vector, not normalised (llama.cpp's --pooling none)",
    )
    embd_normalize: StrictInt = Field(
        2,
        ge=-1,
        description="-1: none, 0: max absolute (int16 range), 1: taxicab, 2: Euclidean, "
        "p > 2: p-norm",
    )
