"""Request models: every dialect's field names mapped onto one canonical shape.

Each alias sits next to the field it maps to (OpenAI first, then llama.cpp, mistral.rs, Fireworks,
vLLM). Unknown fields are accepted and ignored; known fields whose feature has not landed yet are
refused by name when they would change the output (see NOT_YET_SUPPORTED).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    ValidationInfo,
    field_validator,
    model_validator,
)

from ..sampling.breakers import DEFAULT_BREAKERS
from ..sampling.params import DEFAULT_SAMPLERS, SAMPLER_ALIASES, SAMPLER_LETTERS
from ..settings import Limits

DEFAULT_MAX_TOKENS = 16
MAX_STOP_STRINGS = 16
MAX_LOGIT_BIAS = 100.0
MAX_BREAKERS = 32
MAX_TEXT_CHARS = 4_000_000  # a suffix or infill piece; the body limit bounds them all anyway
MAX_EXTRA_CHUNKS = 256
MAX_WINDOW = 2**31 - 1  # penalty windows: MLX slices with 32-bit indices; "all" needs no more

PromptPart = str | StrictInt
PromptInput = str | list[PromptPart | list[PromptPart]]


def alias(*names: str) -> AliasChoices:
    return AliasChoices(*names)


def documented(*examples: dict[str, Any]):
    """A request model's JSON-schema hook: its aliases (below) and `examples` (fuzzers start
    from them)."""

    def extra(schema: dict[str, Any], model: type[BaseModel]) -> None:
        for name in _NULL_IS_DEFAULT & schema.get("properties", {}).keys():
            _allow_null(schema["properties"][name])
        document_aliases(schema, model)
        if examples:
            schema["examples"] = list(examples)

    return extra


def _allow_null(prop: dict[str, Any]) -> None:
    """`"n": null` means the default (OpenAI's clients send it): say so in the schema."""
    meta = {"title", "description", "default", "examples"}
    core = {k: prop.pop(k) for k in list(prop) if k not in meta}
    branches = core["anyOf"] if list(core) == ["anyOf"] else [core]
    if {"type": "null"} not in branches:
        branches = [*branches, {"type": "null"}]
    prop["anyOf"] = branches


def document_aliases(schema: dict[str, Any], model: type[BaseModel]) -> None:
    """Every name a field accepts appears in the JSON schema, so /openapi.json lists
    `n_predict`, `repeat_penalty`, `mirostat_lr`... beside the canonical name."""
    properties = schema.get("properties", {})
    for name, info in model.model_fields.items():
        choices = info.validation_alias.choices if info.validation_alias else []
        names = [name, *(c for c in choices if isinstance(c, str))]
        shown = next((n for n in names if n in properties), None)
        if shown is None:
            continue
        for other in names:
            if other not in properties:
                properties[other] = {
                    **properties[shown],
                    "title": other,
                    "description": f"Alias of `{shown}`.",
                }


# JSON-schema facts the validators below enforce, written out for /openapi.json.
STOP_SCHEMA = {
    "anyOf": [
        {"type": "string"},
        {"type": "array", "items": {"type": "string"}, "maxItems": MAX_STOP_STRINGS},
        {"type": "null"},
    ]
}
LOGIT_BIAS_SCHEMA = {
    "anyOf": [
        {
            "type": "object",
            "propertyNames": {"pattern": "^-?[0-9]+$"},
            "additionalProperties": {
                "type": "number",
                "minimum": -MAX_LOGIT_BIAS,
                "maximum": MAX_LOGIT_BIAS,
            },
        },
        {"type": "null"},
    ]
}
_TOKEN_ID = {"type": "integer", "minimum": 0}
_PIECES = {  # one prompt: token ids, or llama.cpp's mix of text and ids
    "type": "array",
    "minItems": 1,
    "items": {"anyOf": [{"type": "string"}, _TOKEN_ID]},
}
PROMPT_SCHEMA = {
    "anyOf": [
        {"type": "string"},
        _PIECES,
        {"type": "array", "minItems": 1, "items": {"type": "string"}},  # several prompts
        {"type": "array", "minItems": 1, "items": _PIECES},  # several, as ids
    ]
}
SAMPLER_NAMES = sorted({*DEFAULT_SAMPLERS, "infill", *SAMPLER_ALIASES})
SAMPLERS_SCHEMA = {
    "anyOf": [
        {"type": "array", "items": {"enum": SAMPLER_NAMES}},
        {"type": "string", "pattern": f"^[{''.join(sorted(SAMPLER_LETTERS))}]*$"},
        {"type": "null"},
    ]
}
# Limits a server's flags set (settings.Limits); /openapi.json shows the values it runs with.
LIMITED_FIELDS = {
    "max_tokens": "max_tokens",
    "n": "max_n",
    "best_of": "max_n",
    "logprobs": "max_logprobs",
}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: StrictBool = False


# Fields whose feature is not built yet, with the values that mean "off" (accepted as such).
# They are declared on CompletionRequest with only those values, so the schema says so too.
NOT_YET_SUPPORTED: dict[str, tuple[Any, ...]] = {
    "prompt_logprobs": (None,),
    "use_beam_search": (None, False),
}


class ResponseFormat(BaseModel):
    """OpenAI's, Fireworks' and llama.cpp's response_format."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    type: Literal["text", "json_object", "json_schema"]
    schema_: dict[str, Any] | None = Field(None, alias="schema")  # Fireworks, llama.cpp
    json_schema: dict[str, Any] | None = None  # OpenAI: {"name", "schema", "strict"}


class TypedGrammar(BaseModel):
    """mistral.rs's grammar: {"type": ..., "value": ...}."""

    type: Literal["regex", "json_schema", "lark", "llguidance"]
    value: str | dict[str, Any]


class StructuredOutputs(BaseModel):
    """vLLM's structured_outputs (the newer spelling of its guided_* fields)."""

    model_config = ConfigDict(extra="allow")
    json_: dict[str, Any] | str | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = Field(None, min_length=1)
    grammar: str | None = None


class ToolFunction(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})


class Tool(BaseModel):
    type: Literal["function"] = "function"
    function: ToolFunction


class NamedToolChoice(BaseModel):
    type: Literal["function"] = "function"
    function: dict[str, str]


class CompletionRequest(BaseModel):
    """POST /v1/completions, in OpenAI's, llama.cpp's, mistral.rs's, Fireworks' and vLLM's names."""

    model_config = ConfigDict(
        extra="allow",
        allow_inf_nan=False,
        populate_by_name=True,
        json_schema_extra=documented(
            {"prompt": "def add(a, b):\n", "max_tokens": 16, "temperature": 0, "stop": ["\n\n"]},
            {"prompt": [[1, 2, 3], [4, 5]], "n": 2, "logprobs": 2, "echo": True, "max_tokens": 4},
            {"prompt": "x", "stream": True, "stream_options": {"include_usage": True}, "seed": 1},
            {"prompt": "def f(", "suffix": "\n    return x\n", "max_tokens": 8},
            {
                "prompt": "Answer: ",
                "max_tokens": 8,
                "response_format": {"type": "json_schema", "json_schema": {"schema": {}}},
            },
            {"prompt": "x", "max_tokens": 8, "mirostat": 2, "dry_multiplier": 0.8, "top_k": 40},
        ),
    )

    model: str | None = None
    prompt: PromptInput = Field(
        description="text, token ids, or a list of either", json_schema_extra=PROMPT_SCHEMA
    )
    suffix: str | None = Field(
        None,
        max_length=MAX_TEXT_CHARS,
        description="text after the insertion point: the server builds the model's "
        "fill-in-the-middle prompt (prompt = the text before it)",
    )
    max_tokens: StrictInt | None = Field(
        DEFAULT_MAX_TOKENS,
        ge=-1,
        validation_alias=alias("max_tokens", "n_predict", "max_completion_tokens"),
        description="-1 or null: until the context window is full",
    )
    temperature: StrictFloat = Field(1.0, ge=0.0, le=10.0, description="0 = greedy")
    top_p: StrictFloat = Field(1.0, gt=0.0, le=1.0)
    top_k: StrictInt = Field(0, ge=-1, description="0 or -1 = off")
    min_p: StrictFloat = Field(0.0, ge=0.0, le=1.0)
    n: StrictInt = Field(1, ge=1)
    best_of: StrictInt | None = Field(None, ge=1)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    logprobs: StrictInt | None = Field(None, ge=0, validation_alias=alias("logprobs", "n_probs"))
    echo: StrictBool = False
    stop: str | list[str] | None = Field(None, validate_default=True, json_schema_extra=STOP_SCHEMA)
    stop_token_ids: list[StrictInt] | None = None
    include_stop_str_in_output: StrictBool = False
    min_tokens: StrictInt = Field(0, ge=0)
    ignore_eos: StrictBool = False
    typical_p: StrictFloat = Field(1.0, gt=0.0, le=1.0, description="1 = off")
    top_n_sigma: StrictFloat = Field(-1.0, ge=-1.0, le=100.0, description="<= 0 = off")
    xtc_probability: StrictFloat = Field(0.0, ge=0.0, le=1.0)
    xtc_threshold: StrictFloat = Field(0.1, ge=0.0, le=1.0)
    dynatemp_range: StrictFloat = Field(0.0, ge=0.0, le=10.0)
    dynatemp_exponent: StrictFloat = Field(1.0, gt=0.0, le=100.0)
    mirostat: StrictInt = Field(
        0, ge=0, le=2, description="0 = off, 1 = Mirostat, 2 = Mirostat 2.0"
    )
    mirostat_tau: StrictFloat = Field(
        5.0, gt=0.0, le=100.0, validation_alias=alias("mirostat_tau", "mirostat_target")
    )
    mirostat_eta: StrictFloat = Field(
        0.1, gt=0.0, le=1.0, validation_alias=alias("mirostat_eta", "mirostat_lr")
    )
    dry_multiplier: StrictFloat = Field(0.0, ge=0.0, le=100.0, description="0 = off")
    dry_base: StrictFloat = Field(1.75, ge=0.0, le=100.0)
    dry_allowed_length: StrictInt = Field(2, ge=0, le=10_000)
    dry_penalty_last_n: StrictInt = Field(
        64, ge=-1, le=MAX_WINDOW, description="-1 = whole context, 0 = off"
    )
    dry_sequence_breakers: list[str] = Field(
        default_factory=lambda: list(DEFAULT_BREAKERS), max_length=MAX_BREAKERS
    )
    samplers: list[str] | str | None = Field(
        None,
        description="llama.cpp's sampler order: names or one letter each",
        json_schema_extra=SAMPLERS_SCHEMA,
    )
    logit_bias: dict[str, StrictFloat] | None = Field(None, json_schema_extra=LOGIT_BIAS_SCHEMA)
    seed: StrictInt | None = Field(None, ge=-(2**63), lt=2**64, description="-1 = random")
    presence_penalty: StrictFloat = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: StrictFloat = Field(0.0, ge=-2.0, le=2.0)
    repetition_penalty: StrictFloat = Field(
        1.0, gt=0.0, le=10.0, validation_alias=alias("repetition_penalty", "repeat_penalty")
    )
    repeat_last_n: StrictInt = Field(
        64,
        ge=-1,
        le=MAX_WINDOW,
        description="penalty window in tokens, prompt included; -1 = all, 0 = off",
    )
    allowed_token_ids: list[StrictInt] | None = None
    skip_special_tokens: StrictBool = True
    context_length_exceeded_behavior: Literal["truncate", "error"] = "error"
    truncate_sequence: StrictBool = False
    truncate_prompt_tokens: StrictInt | None = Field(None, ge=1)
    cache_prompt: StrictBool = True
    n_indent: StrictInt = Field(
        0, ge=0, le=10_000, description="llama.cpp: end at a later line indented less than this"
    )
    t_max_predict_ms: StrictInt = Field(
        0, ge=0, description="llama.cpp: once a line break was generated, stop after this time"
    )
    t_max_prompt_ms: StrictInt = Field(-1, description="llama.cpp: accepted; it does not act on it")
    id_slot: StrictInt = Field(
        -1, description="llama.cpp: accepted; one batch serves every request"
    )
    return_token_ids: StrictBool = Field(
        False,
        validation_alias=alias("return_token_ids", "return_tokens"),
        description="vLLM: each choice carries prompt_token_ids (what the model saw) and "
        "token_ids; llama.cpp's return_tokens: `tokens` in /completion and /infill answers",
    )
    timings_per_token: StrictBool = Field(
        False, description="llama.cpp: add prompt/decode `timings` to the response"
    )
    user: str | None = None
    # Output constraints (api/constraints.py maps them onto one grammar; at most one per request).
    grammar: str | TypedGrammar | None = Field(
        None, description="llama.cpp: a GBNF string; mistral.rs: {type, value}"
    )
    json_schema: dict[str, Any] | None = None
    response_format: ResponseFormat | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = Field(None, min_length=1)
    guided_grammar: str | None = None
    structured_outputs: StructuredOutputs | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    prompt_logprobs: None = Field(None, description="vLLM: not supported yet (null only)")
    use_beam_search: Literal[False] | None = Field(
        None, description="vLLM: not supported (false or null only)"
    )

    @model_validator(mode="before")
    @classmethod
    def _null_means_default(cls, data: Any) -> Any:
        """OpenAI's clients send `"n": null` and the like for "use the default".

        max_tokens is the exception: null there means "until the context window is full".
        """
        if not isinstance(data, dict):
            return data
        return {k: v for k, v in data.items() if not (v is None and k in _NULL_IS_DEFAULT)}

    @field_validator("prompt")
    @classmethod
    def _prompt_not_empty(cls, prompt: PromptInput) -> PromptInput:
        if isinstance(prompt, list) and (not prompt or any(p == [] for p in prompt)):
            raise ValueError("prompt must not be an empty list")
        return prompt

    @field_validator(*LIMITED_FIELDS)
    @classmethod
    def _within_limits(cls, value: int | None, info: ValidationInfo) -> int | None:
        """This server's limits (its flags), passed as the validation context."""
        limits = (info.context or {}).get("limits") or Limits()
        limit = getattr(limits, LIMITED_FIELDS[info.field_name])
        if value is not None and value > limit:
            raise ValueError(f"Input should be less than or equal to {limit} (this server's limit)")
        return value

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, stop: str | list[str] | None) -> list[str]:
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        if len(stops) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings are accepted")
        return [s for s in stops if s]

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, bias: dict[str, StrictFloat] | None) -> dict[str, StrictFloat] | None:
        for key, value in (bias or {}).items():
            if not key.lstrip("-").isdigit():
                raise ValueError(f"logit_bias keys must be token ids, got {key!r}")
            if not -MAX_LOGIT_BIAS <= value <= MAX_LOGIT_BIAS:
                raise ValueError(f"logit_bias values must be in [-100, 100], got {value}")
        return bias

    @property
    def stop_strings(self) -> list[str]:
        return self.stop  # normalised to a list by the validator

    @property
    def truncate(self) -> bool:
        return (
            self.context_length_exceeded_behavior == "truncate"
            or self.truncate_sequence
            or self.truncate_prompt_tokens is not None
        )


def _keys_where_null_is_default() -> frozenset[str]:
    keys = set()
    for name, info in CompletionRequest.model_fields.items():
        if info.default is not None and name != "max_tokens":
            keys.update(info.validation_alias.choices if info.validation_alias else [name])
    return frozenset(keys)


_NULL_IS_DEFAULT = _keys_where_null_is_default()


# ---- llama.cpp's native routes: /completion and /infill ----------------------------------------


class NativeCompletionRequest(CompletionRequest):
    """POST /completion: llama.cpp's field names and its defaults (n_predict -1 = until the
    context is full; temperature 0.8, top_k 40, top_p 0.95, min_p 0.05)."""

    model_config = ConfigDict(
        json_schema_extra=documented(
            {"prompt": "def add(a, b):\n", "n_predict": 16, "n_probs": 2, "cache_prompt": True},
            {"prompt": "x", "n_predict": 8, "stream": True, "samplers": "kpt"},
        )
    )

    max_tokens: StrictInt | None = Field(
        -1,
        ge=-1,
        validation_alias=alias("n_predict", "max_tokens"),
        description="-1: until the context window is full",
    )
    temperature: StrictFloat = Field(0.8, ge=0.0, le=10.0)
    top_k: StrictInt = Field(40, ge=-1)
    top_p: StrictFloat = Field(0.95, gt=0.0, le=1.0)
    min_p: StrictFloat = Field(0.05, ge=0.0, le=1.0)
    response_fields: list[str] | None = Field(
        None, description="llama.cpp: return only these fields ('timings/prompt_n' = nested)"
    )


class InfillChunk(BaseModel):
    """One chunk of another file an editor sends as context."""

    model_config = ConfigDict(extra="allow")
    filename: str = Field("tmp", max_length=4096)
    text: str = Field("", max_length=MAX_TEXT_CHARS)


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


class LoadRequest(BaseModel):
    """POST /admin/load: a model by its id from GET /v1/models (never a path)."""

    model_config = ConfigDict(extra="allow")
    model: str = Field(min_length=1, max_length=1024, description="an id from GET /v1/models")
