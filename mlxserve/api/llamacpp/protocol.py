"""llama.cpp's request shapes: the shared request model with its defaults and extra fields."""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt

from ...fim import InfillParts
from ...planning.defaults import LLAMACPP_MAX_TOKENS, LLAMACPP_SAMPLING
from ...planning.request import Request
from ..protocol import (
    LIMITED_FIELDS,
    MAX_TEXT_CHARS,
    MAX_TOKENS_FIELD,
    CompletionRequest,
    PromptInput,
    alias,
)
from ..schema_docs import documented

MAX_EXTRA_CHUNKS = 256


class MultimodalPrompt(BaseModel):
    """llama.cpp's prompt with images: a `<__media__>` marker in the text where each goes."""

    model_config = ConfigDict(extra="forbid")
    prompt_string: str = Field(max_length=MAX_TEXT_CHARS)
    multimodal_data: list[str] = Field(
        max_length=64, description="images, base64 (or data URLs), one a <__media__> marker"
    )


class NativeCompletionRequest(CompletionRequest):
    """POST /completion: llama.cpp's field names and its defaults (n_predict -1 = until the
    context is full; temperature 0.8, top_k 40, top_p 0.95, min_p 0.05)."""

    model_config = ConfigDict(
        json_schema_extra=documented(
            {"prompt": "def add(a, b):\n", "n_predict": 16, "n_probs": 2, "cache_prompt": True},
            {"prompt": "x", "n_predict": 8, "stream": True, "samplers": "kpt"},
        )
    )
    # llama.cpp's n_probs has no OpenAI bound: clients send 10 and more.
    limited_fields: ClassVar[dict[str, str]] = {**LIMITED_FIELDS, "logprobs": "max_n_probs"}

    max_tokens: StrictInt | None = Field(
        LLAMACPP_MAX_TOKENS,
        ge=-1,
        le=MAX_TOKENS_FIELD,
        validation_alias=alias("n_predict", "max_tokens"),
        description="-1: until the context window is full",
    )
    temperature: StrictFloat = Field(LLAMACPP_SAMPLING.temperature, ge=0.0, le=10.0)
    top_k: StrictInt = Field(LLAMACPP_SAMPLING.top_k, ge=-1)
    top_p: StrictFloat = Field(LLAMACPP_SAMPLING.top_p, gt=0.0, le=1.0)
    min_p: StrictFloat = Field(LLAMACPP_SAMPLING.min_p, ge=0.0, le=1.0)
    post_sampling_probs: StrictBool = Field(
        False, description="n_probs as probabilities after the sampler chain (prob, top_probs)"
    )
    response_fields: list[str] | None = Field(
        None, description="llama.cpp: return only these fields ('timings/prompt_n' = nested)"
    )
    prompt: PromptInput | MultimodalPrompt = Field(
        description="text, token ids, a list of either, or {prompt_string, multimodal_data}: "
        "text with a <__media__> marker where each image goes"
    )

    def to_request(self) -> Request:
        request = super().to_request()
        output = replace(request.output, post_sampling_probs=self.post_sampling_probs)
        if isinstance(self.prompt, MultimodalPrompt):
            return replace(
                request,
                output=output,
                prompt=self.prompt.prompt_string,
                media=tuple(self.prompt.multimodal_data),
            )
        return replace(request, output=output)


class InfillChunk(BaseModel):
    """One chunk of another file an editor sends as context."""

    model_config = ConfigDict(extra="allow")
    filename: str = Field("tmp", max_length=4096)
    text: str = Field(max_length=MAX_TEXT_CHARS)  # required, as llama.cpp requires it


class InfillRequest(NativeCompletionRequest):
    """POST /infill as llama.vim and llama.vscode send it."""

    model_config = ConfigDict(
        json_schema_extra=documented(
            {
                "input_prefix": "def add(a, b):\n",
                "input_suffix": "\n",
                "input_extra": [{"filename": "util.py", "text": "import math\n"}],
                "prompt": "    return ",
                "n_predict": 16,
                "n_indent": 4,
                "t_max_predict_ms": 500,
                "samplers": ["top_k", "top_p", "infill"],
                "cache_prompt": True,
            }
        )
    )

    prompt: str = Field(
        "", max_length=MAX_TEXT_CHARS, description="the current line up to the cursor"
    )
    input_prefix: str = Field("", max_length=MAX_TEXT_CHARS)
    input_suffix: str = Field("", max_length=MAX_TEXT_CHARS)
    input_extra: list[InfillChunk] = Field(default_factory=list, max_length=MAX_EXTRA_CHUNKS)

    def to_request(self) -> Request:
        """The prefix, suffix, current line and other files' chunks: the parts of the model's
        fill-in-the-middle prompt."""
        parts = InfillParts(
            prefix=self.input_prefix,
            suffix=self.input_suffix,
            prompt=self.prompt,
            extra=[(chunk.filename, chunk.text) for chunk in self.input_extra],
        )
        return replace(super().to_request(), prompt=None, infill=parts)


class TokenizeRequest(BaseModel):
    """POST /tokenize: llama.cpp's fields and defaults (no BOS unless asked; special-token text
    such as `<|im_start|>` is parsed as the special token unless `parse_special` is false)."""

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={
            "examples": [
                {"content": "def add(a, b):", "with_pieces": True},
                {"content": "<|im_start|>user", "add_special": True, "parse_special": False},
            ]
        },
    )

    content: str = Field(max_length=MAX_TEXT_CHARS)
    add_special: StrictBool = False
    parse_special: StrictBool = True
    with_pieces: StrictBool = False
    model: str | None = None


class DetokenizeRequest(BaseModel):
    """POST /detokenize: token ids back to text, special tokens included."""

    model_config = ConfigDict(extra="allow", json_schema_extra={"examples": [{"tokens": [1, 2]}]})

    tokens: list[StrictInt] = Field(max_length=MAX_TEXT_CHARS)
    model: str | None = None


class SlotsQuery(BaseModel):
    """GET /slots' query string."""

    fail_on_no_slot: StrictInt | None = Field(
        None, description="1: answer 503 when every slot is busy"
    )


class SlotActionQuery(BaseModel):
    """POST /slots/{id_slot}'s query string (each action is answered 501 here)."""

    action: str = Field(description="save, restore or erase")
