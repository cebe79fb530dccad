"""Ollama's request shapes: /api/show, /api/generate, /api/chat, their `options` and
`keep_alive`. Sampling options keep the OpenAI doors' bounds under Ollama's names, so a bad value
is refused naming the option the client sent; translate.py makes the canonical request."""

from __future__ import annotations

import math
import re
from dataclasses import replace
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    ValidationInfo,
    field_validator,
)

from ...planning import defaults
from ...sampling.params import SamplingParams
from ...settings import Limits
from ..constraints import Tool
from ..protocol import MAX_TEXT_CHARS, MAX_TOKENS_FIELD, GenerationOptions, stop_strings

MAX_TOP_LOGPROBS = 20  # Ollama's bound
# Sampling options under Ollama's name -> the sampler's setting.
SAMPLING_OPTIONS = {
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "typical_p": "typical_p",
    "repeat_penalty": "repetition_penalty",
    "repeat_last_n": "repeat_last_n",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "mirostat": "mirostat",
    "mirostat_tau": "mirostat_tau",
    "mirostat_eta": "mirostat_eta",
}
FOREVER = math.inf
MAX_KEEP_ALIVE_S = 100 * 365 * 86400.0  # longer is for ever (and beyond what a clock holds)


def _bounded(field: str, description: str | None = None) -> Any:
    """An option with the bounds of the OpenAI doors' `field`; unset: Ollama's default."""
    bounds = {}
    for constraint in GenerationOptions.model_fields[field].metadata:
        for key in ("gt", "ge", "lt", "le"):
            if getattr(constraint, key, None) is not None:
                bounds[key] = getattr(constraint, key)
    return Field(None, description=description, **bounds)


class Options(BaseModel):
    """Ollama's `options`. Sampling ones map onto the sampler; runtime ones (num_gpu,
    num_thread, use_mmap, num_batch, ...) are accepted and ignored: MLX manages the GPU."""

    model_config = ConfigDict(extra="allow")

    num_predict: StrictInt | None = Field(
        None,
        ge=-2,
        le=MAX_TOKENS_FIELD,
        description="-1 (or -2): until the model ends or the context is full",
    )
    num_ctx: StrictInt | None = Field(
        None, ge=1, description="the prompt keeps its last num_ctx tokens (the context window)"
    )
    num_keep: StrictInt | None = Field(
        None,
        description="where the prompt is cut, its first num_keep tokens (after BOS) stay "
        f"(default {defaults.OLLAMA_NUM_KEEP}); -1: all of them that fit",
    )
    temperature: StrictFloat | None = _bounded("temperature", "default 0.8")
    top_k: StrictInt | None = _bounded("top_k", "default 40; 0 = off")
    top_p: StrictFloat | None = _bounded("top_p", "default 0.9")
    min_p: StrictFloat | None = _bounded("min_p")
    typical_p: StrictFloat | None = _bounded("typical_p")
    repeat_penalty: StrictFloat | None = _bounded("repetition_penalty", "default 1.1")
    repeat_last_n: StrictInt | None = _bounded("repeat_last_n", "default 64; -1 = num_ctx")
    presence_penalty: StrictFloat | None = _bounded("presence_penalty")
    frequency_penalty: StrictFloat | None = _bounded("frequency_penalty")
    mirostat: StrictInt | None = _bounded("mirostat")
    mirostat_tau: StrictFloat | None = _bounded("mirostat_tau")
    mirostat_eta: StrictFloat | None = _bounded("mirostat_eta")
    seed: StrictInt | None = _bounded("seed", "-1 = random")
    stop: list[str] | str | None = None  # a list once validated

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, stop: list[str] | str | None) -> list[str]:
        return stop_strings(stop)

    def sampling(self) -> SamplingParams:
        """The sampler's settings: these options, Ollama's defaults under them."""
        chosen = {
            name: getattr(self, option)
            for option, name in SAMPLING_OPTIONS.items()
            if getattr(self, option) is not None
        }
        if "top_k" in chosen:
            chosen["top_k"] = defaults.top_k(chosen["top_k"])
        return replace(defaults.OLLAMA_SAMPLING, **chosen)


# One number and unit of a Go duration ("1.5h", "300ms").
DURATION_PART = r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)"
DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """Seconds in Go's duration syntax ("5m", "1h30m", "300ms", "0"), as Ollama reads
    keep_alive; a bare number is seconds."""
    try:
        return float(text)
    except ValueError:
        pass
    text = text.strip()
    sign, body = (text[0], text[1:]) if text[:1] in ("+", "-") else ("", text)
    if re.fullmatch(f"(?:{DURATION_PART})+", body) is None:
        raise ValueError(
            f'must be a number of seconds or a duration such as "5m", "1h30m", "300ms" '
            f"(got {text!r})"
        )
    seconds = sum(float(n) * DURATION_UNITS[u] for n, u in re.findall(DURATION_PART, body))
    return -seconds if sign == "-" else seconds


def keep_alive_seconds(value: float | str | None) -> float | None:
    """A request's `keep_alive` as seconds to stay loaded; FOREVER for a negative one."""
    if value is None:
        return None
    seconds = parse_duration(value) if isinstance(value, str) else float(value)
    return FOREVER if seconds < 0 or seconds > MAX_KEEP_ALIVE_S else seconds


class GenerationFields(BaseModel):
    """What /api/generate and /api/chat share."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1, max_length=1024, description="a name from GET /api/tags")
    format: Literal["", "json"] | dict[str, Any] | None = Field(
        None, description='"json", or a JSON schema the answer follows'
    )
    options: Options | None = None
    stream: StrictBool = True
    think: StrictBool | Literal["high", "medium", "low"] | None = Field(
        None, description="reasoning goes to `thinking`; false asks the template not to think"
    )
    keep_alive: StrictFloat | str | None = Field(
        None,
        description='how long the model stays loaded after this request: seconds or "5m"; '
        "negative = forever, 0 = unload now; unset: the server's --idle-unload",
    )
    logprobs: StrictBool = False
    top_logprobs: StrictInt = Field(0, ge=0, le=MAX_TOP_LOGPROBS)

    @field_validator("top_logprobs")
    @classmethod
    def _within_limit(cls, value: int, info: ValidationInfo) -> int:
        """This server's --max-top-logprobs, as on OpenAI's chat (with logprobs asked)."""
        limit = ((info.context or {}).get("limits") or Limits()).max_top_logprobs
        if info.data.get("logprobs") and value > limit:
            raise ValueError(f"must be less than or equal to {limit} (this server's limit)")
        return value

    @field_validator("keep_alive")
    @classmethod
    def _seconds(cls, value: float | str | None) -> float | None:
        return keep_alive_seconds(value)

    @property
    def sampling_options(self) -> Options:
        return self.options or Options()


class GenerateRequest(GenerationFields):
    """POST /api/generate."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"model": "mlxserve-demo-coder", "prompt": "Why is the sky blue?"},
                {
                    "model": "mlxserve-demo-coder",
                    "prompt": "def add(a, b):\n    ",
                    "suffix": "\n\nprint(add(1, 2))\n",
                    "options": {"temperature": 0, "num_predict": 32},
                    "stream": False,
                },
            ]
        }
    )

    prompt: str = Field("", max_length=MAX_TEXT_CHARS)
    suffix: str | None = Field(
        None, max_length=MAX_TEXT_CHARS, description="the text after the cursor (FIM models)"
    )
    system: str | None = Field(None, max_length=MAX_TEXT_CHARS)
    template: str | None = Field(None, description="not supported: the model's template is used")
    raw: StrictBool = Field(False, description="the prompt as is, no chat template")
    context: list[StrictInt] | None = Field(
        None, max_length=MAX_TEXT_CHARS, description="a previous answer's `context` to continue"
    )
    images: list[Any] | None = Field(
        None, description="base64 images, for a vision model (with the chat template: not raw)"
    )


class OllamaFunctionCall(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1)
    arguments: dict[str, Any] | str = Field(default_factory=dict)


class OllamaToolCall(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str | None = None
    function: OllamaFunctionCall


class OllamaMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str = ""
    thinking: str | None = None
    images: list[Any] | None = None
    tool_calls: list[OllamaToolCall] | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None


class ChatRequest(GenerationFields):
    """POST /api/chat."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "model": "mlxserve-demo-coder",
                    "messages": [{"role": "user", "content": "Why is the sky blue?"}],
                },
                {
                    "model": "mlxserve-demo-coder",
                    "messages": [{"role": "user", "content": "A user as JSON"}],
                    "format": {"type": "object", "properties": {"name": {"type": "string"}}},
                    "stream": False,
                },
            ]
        }
    )

    messages: list[OllamaMessage] = Field(default_factory=list)
    tools: list[Tool] | None = None


class ShowRequest(BaseModel):
    """POST /api/show: `model` (older clients send `name`)."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    name: str | None = None
    verbose: StrictBool = False

    @property
    def model_name(self) -> str:
        return self.model or self.name or ""
