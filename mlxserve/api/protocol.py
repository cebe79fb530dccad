"""The OpenAI doors' request models: every dialect's field names, each validated once and
translated once into the canonical request (mlxserve/planning/request.py).

`GenerationOptions` holds what /v1/completions and /v1/chat/completions share (sampling, stop,
output options, constraints, and the rules spanning them); `CompletionRequest` adds the prompt,
llama.cpp's routes subclass it (llamacpp/protocol.py), and chat adds its messages
(openai/chat_protocol.py). Each alias sits next to the field it maps to (OpenAI first, then
llama.cpp, mistral.rs, Fireworks, vLLM). Unknown fields are accepted and ignored; known fields
whose feature has not landed yet are refused by name when they would change the output (see
NOT_YET_SUPPORTED). Every rule is checked here, so a front door gets a request that is whole or
a 400.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

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

from ..engine import StopSpec
from ..planning import defaults
from ..planning.request import ContextFit, Output, Request
from ..sampling.grammars import Constraint
from ..sampling.params import DEFAULT_SAMPLERS, SAMPLER_ALIASES, SAMPLER_LETTERS, SamplingParams
from ..settings import Limits
from ..speculation.planner import MAX_DRAFT_TOKENS
from .constraints import (
    NamedToolChoice,
    ResponseFormat,
    StructuredOutputs,
    Tool,
    TypedGrammar,
    constraint_of,
)
from .errors import FieldError
from .schema_docs import (
    KNOWN_SAMPLERS,
    LOGIT_BIAS_SCHEMA,
    MAX_LOGIT_BIAS,
    MAX_STOP_STRINGS,
    PROMPT_SCHEMA,
    SAMPLERS_SCHEMA,
    STOP_SCHEMA,
    documented,
)

SAMPLING, DRY = defaults.SAMPLING, defaults.DRY
MAX_TOKENS_FIELD = 2**31 - 1  # llama.cpp reads n_predict as a 32-bit int; more is a client bug
MAX_BREAKERS = 32
MAX_TEXT_CHARS = 4_000_000  # a suffix or infill piece; the body limit bounds them all anyway
MAX_WINDOW = 2**31 - 1  # penalty windows: MLX slices with 32-bit indices; "all" needs no more

PromptPart = str | StrictInt
PromptInput = str | list[PromptPart | list[PromptPart]]


def alias(*names: str) -> AliasChoices:
    return AliasChoices(*names)


# Limits a server's flags set (settings.Limits) on OpenAI's routes; a request model may set its
# own (`limited_fields`). /openapi.json shows the values the server runs with.
LIMITED_FIELDS = {"n": "max_n", "best_of": "max_n"}
# The fields a door's model may limit: the shared ones and the doors' logprobs.
LIMITABLE = (*LIMITED_FIELDS, "logprobs", "top_logprobs")


def stop_strings(stop: str | list[str] | None) -> list[str]:
    """A `stop` field's strings as a list, the empty ones dropped (a ValueError past
    MAX_STOP_STRINGS: the field's validator names the field)."""
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if len(stops) > MAX_STOP_STRINGS:
        raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings are accepted")
    return [s for s in stops if s]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: StrictBool = False


# Fields whose feature is not built yet, with the values that mean "off" (accepted as such).
# They are declared on GenerationOptions with only those values, so the schema says so too.
NOT_YET_SUPPORTED: dict[str, tuple[Any, ...]] = {
    "prompt_logprobs": (None,),
    "use_beam_search": (None, False),
}


class GenerationOptions(BaseModel):
    """What OpenAI's completions and chat share, in OpenAI's, llama.cpp's, mistral.rs's,
    Fireworks' and vLLM's names: sampling, stop, output options and constraints."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False, populate_by_name=True)
    limited_fields: ClassVar[dict[str, str]] = LIMITED_FIELDS

    model: str | None = None
    # Each door declares its own: its default, and which of its names wins.
    max_tokens: StrictInt | None = Field(None, ge=-1, le=MAX_TOKENS_FIELD)
    temperature: StrictFloat = Field(
        SAMPLING.temperature, ge=0.0, le=10.0, description="0 = greedy"
    )
    top_p: StrictFloat = Field(SAMPLING.top_p, gt=0.0, le=1.0)
    top_k: StrictInt = Field(SAMPLING.top_k, ge=-1, description="0 or -1 = off")
    min_p: StrictFloat = Field(SAMPLING.min_p, ge=0.0, le=1.0)
    n: StrictInt = Field(1, ge=1, validation_alias=alias("n", "n_cmpl"))
    best_of: StrictInt | None = Field(None, ge=1)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = Field(None, validate_default=True, json_schema_extra=STOP_SCHEMA)
    stop_token_ids: list[StrictInt] | None = None
    include_stop_str_in_output: StrictBool = False
    min_tokens: StrictInt = Field(0, ge=0)
    ignore_eos: StrictBool = False
    typical_p: StrictFloat = Field(SAMPLING.typical_p, gt=0.0, le=1.0, description="1 = off")
    top_n_sigma: StrictFloat = Field(
        SAMPLING.top_n_sigma, ge=-1.0, le=100.0, description="<= 0 = off"
    )
    xtc_probability: StrictFloat = Field(SAMPLING.xtc_probability, ge=0.0, le=1.0)
    xtc_threshold: StrictFloat = Field(SAMPLING.xtc_threshold, ge=0.0, le=1.0)
    dynatemp_range: StrictFloat = Field(SAMPLING.dynatemp_range, ge=0.0, le=10.0)
    dynatemp_exponent: StrictFloat = Field(SAMPLING.dynatemp_exponent, gt=0.0, le=100.0)
    mirostat: StrictInt = Field(
        SAMPLING.mirostat, ge=0, le=2, description="0 = off, 1 = Mirostat, 2 = Mirostat 2.0"
    )
    mirostat_tau: StrictFloat = Field(
        SAMPLING.mirostat_tau,
        gt=0.0,
        le=100.0,
        validation_alias=alias("mirostat_tau", "mirostat_target"),
    )
    mirostat_eta: StrictFloat = Field(
        SAMPLING.mirostat_eta, gt=0.0, le=1.0, validation_alias=alias("mirostat_eta", "mirostat_lr")
    )
    dry_multiplier: StrictFloat = Field(DRY.multiplier, ge=0.0, le=100.0, description="0 = off")
    dry_base: StrictFloat = Field(DRY.base, ge=0.0, le=100.0)
    dry_allowed_length: StrictInt = Field(DRY.allowed_length, ge=0, le=10_000)
    dry_penalty_last_n: StrictInt = Field(
        DRY.penalty_last_n, ge=-1, le=MAX_WINDOW, description="-1 = whole context, 0 = off"
    )
    dry_sequence_breakers: list[str] = Field(
        default_factory=lambda: list(DRY.breakers), max_length=MAX_BREAKERS
    )
    samplers: list[str] | str | None = Field(
        None,
        validate_default=True,
        description="llama.cpp's sampler order: names or one letter each",
        json_schema_extra=SAMPLERS_SCHEMA,
    )  # a tuple of canonical names once validated
    logit_bias: (
        dict[str, StrictFloat | Literal[False]]
        | list[tuple[StrictInt | str, StrictFloat | Literal[False]]]
        | None
    ) = Field(None, json_schema_extra=LOGIT_BIAS_SCHEMA)
    seed: StrictInt | None = Field(None, ge=-(2**63), lt=2**64, description="-1 = random")
    presence_penalty: StrictFloat = Field(SAMPLING.presence_penalty, ge=-2.0, le=2.0)
    frequency_penalty: StrictFloat = Field(SAMPLING.frequency_penalty, ge=-2.0, le=2.0)
    repetition_penalty: StrictFloat = Field(
        SAMPLING.repetition_penalty,
        gt=0.0,
        le=10.0,
        validation_alias=alias("repetition_penalty", "repeat_penalty"),
    )
    repeat_last_n: StrictInt = Field(
        SAMPLING.repeat_last_n,
        ge=-1,
        le=MAX_WINDOW,
        description="penalty window in tokens, prompt included; -1 = all, 0 = off",
    )
    allowed_token_ids: list[StrictInt] | None = None
    skip_special_tokens: StrictBool = True
    context_length_exceeded_behavior: Literal["truncate", "error"] = "error"
    truncate_sequence: StrictBool = False
    truncate_prompt_tokens: StrictInt | None = Field(None, ge=1)
    n_keep: StrictInt = Field(
        0,
        ge=-1,
        le=MAX_WINDOW,
        description="llama.cpp: where the prompt is cut, its first n_keep tokens (after BOS) "
        "stay; -1: all of them that fit",
    )
    cache_prompt: StrictBool = True
    num_draft_tokens: StrictInt | None = Field(
        None,
        ge=0,
        le=MAX_DRAFT_TOKENS,
        description="mlx_lm.server: the most drafted tokens verified in one pass for this "
        "request (prompt lookup or --draft-model); 0: no speculative decoding for it",
    )
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
        False,
        description="llama.cpp: add prompt/decode `timings` to the response, and to every "
        "chunk of a stream",
    )
    return_progress: StrictBool = Field(
        False,
        description="llama.cpp: a stream sends `prompt_progress` ({total, cache, processed, "
        "time_ms}) as each chunk of the prompt is read, before the first token",
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
    def _screen(cls, data: Any) -> Any:
        """Refuse fields whose feature has not landed; drop nulls that mean "use the default"
        (OpenAI's clients send `"n": null` and the like).

        max_tokens is the exception: null there means "until the context window is full".
        """
        if not isinstance(data, dict):
            return data
        for name, off_values in NOT_YET_SUPPORTED.items():
            if name in data and not any(data[name] is off for off in off_values):
                raise FieldError(
                    f"'{name}' is not supported by this server yet; remove it or send its default.",
                    param=name,
                    code="unsupported_parameter",
                )
        nulls = cls.null_is_default()
        return {k: v for k, v in data.items() if not (v is None and k in nulls)}

    @field_validator(*LIMITABLE, check_fields=False)
    @classmethod
    def _within_limits(cls, value: int | None, info: ValidationInfo) -> int | None:
        """This server's limits (its flags), passed as the validation context."""
        name = cls.limited_fields.get(info.field_name)
        if name is None:
            return value
        limit = getattr((info.context or {}).get("limits") or Limits(), name)
        if value is not None and value > limit:
            raise ValueError(f"must be less than or equal to {limit} (this server's limit)")
        return value

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, stop: str | list[str] | None) -> list[str]:
        return stop_strings(stop)

    @field_validator("samplers")
    @classmethod
    def _sampler_names(cls, samplers: list[str] | str | None) -> tuple[str, ...]:
        """llama.cpp's `samplers`, names or one-letter codes, as canonical names (checked by
        `_fields_agree`, after every field's own checks)."""
        if samplers is None:
            return DEFAULT_SAMPLERS
        names = (
            [SAMPLER_LETTERS.get(c, c) for c in samplers] if isinstance(samplers, str) else samplers
        )
        return tuple(SAMPLER_ALIASES.get(n, n) for n in names)

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, bias: dict | list | None) -> dict | list | None:
        pairs = bias.items() if isinstance(bias, dict) else bias or []
        for _, value in pairs:
            if value is not False and not -MAX_LOGIT_BIAS <= value <= MAX_LOGIT_BIAS:
                raise ValueError(f"logit_bias values must be in [-100, 100], got {value}")
        return bias

    @model_validator(mode="after")
    def _fields_agree(self) -> GenerationOptions:
        """The rules that span fields, each naming the field to change."""
        if self.best_of is not None and self.best_of < self.n:
            raise FieldError(
                f"best_of ({self.best_of}) must be at least n ({self.n}).", param="best_of"
            )
        if self.stream and self.best_of is not None and self.best_of > self.n:
            raise FieldError(
                "best_of > n cannot be streamed: the best choices are known only at the end.",
                param="best_of",
            )
        if self.max_tokens is not None and 0 < self.max_tokens < self.min_tokens:
            raise FieldError(
                f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens}).",
                param="min_tokens",
            )
        if self.dry_multiplier > 0 and self.dry_base < 1:
            raise FieldError(
                f"dry_base must be at least 1 when DRY is on (dry_multiplier > 0), got "
                f"{self.dry_base}.",
                param="dry_base",
            )
        unknown = next((name for name in self.samplers if name not in KNOWN_SAMPLERS), None)
        if unknown is not None:
            raise FieldError(
                f"Unknown sampler {unknown!r} in 'samplers'; known: {', '.join(DEFAULT_SAMPLERS)} "
                f"(or llama.cpp's letters {''.join(SAMPLER_LETTERS)}).",
                param="samplers",
            )
        return self

    @classmethod
    def null_is_default(cls) -> frozenset[str]:
        """The names (aliases too) whose `null` means the field's default, for every dialect."""
        return _SHARED_NULL_IS_DEFAULT

    @property
    def stop_strings(self) -> list[str]:
        return self.stop  # normalised to a list by the validator

    def _request(
        self,
        *,
        logprobs: int | None,
        constraint: Constraint | None,
        echo: bool = False,
        **door: Any,
    ) -> Request:
        """The canonical request of the shared fields; `door` sets the door's own (its prompt
        or conversation)."""
        return Request(
            sampling=self._sampling(),
            stop=StopSpec(
                strings=tuple(self.stop_strings),
                token_ids=tuple(self.stop_token_ids or ()),
                include_in_output=self.include_stop_str_in_output,
                min_tokens=self.min_tokens,
                ignore_eos=self.ignore_eos,
                min_indent=self.n_indent,
                max_predict_ms=self.t_max_predict_ms or None,
            ),
            model=self.model,
            max_tokens=defaults.until_full(self.max_tokens),
            n=self.n,
            best_of=self.best_of,
            seed=self.seed,
            logit_bias=self.logit_bias,
            constraint=constraint,
            output=Output(
                logprobs=logprobs,
                echo=echo,
                skip_special_tokens=self.skip_special_tokens,
                stream=self.stream,
                usage_in_stream=bool(self.stream_options and self.stream_options.include_usage),
                token_ids=self.return_token_ids,
                timings=self.timings_per_token,
                progress=self.return_progress,
            ),
            fit=ContextFit(
                truncate=self.context_length_exceeded_behavior == "truncate"
                or self.truncate_sequence
                or self.truncate_prompt_tokens is not None,
                keep_last=self.truncate_prompt_tokens,
                keep_first=defaults.kept_tokens(self.n_keep),
            ),
            cache_prompt=self.cache_prompt,
            num_draft_tokens=self.num_draft_tokens,
            user=self.user,
            **door,
        )

    def _sampling(self) -> SamplingParams:
        """The sampler chain's settings that need no tokenizer (planning adds logit_bias's ids,
        DRY's breakers, the infill sampler's ends and the compiled grammar)."""
        return SamplingParams(
            temperature=self.temperature,
            top_k=defaults.top_k(self.top_k),
            top_p=self.top_p,
            min_p=self.min_p,
            typical_p=self.typical_p,
            top_n_sigma=self.top_n_sigma,
            xtc_probability=self.xtc_probability,
            xtc_threshold=self.xtc_threshold,
            dynatemp_range=self.dynatemp_range,
            dynatemp_exponent=self.dynatemp_exponent,
            mirostat=self.mirostat,
            mirostat_tau=self.mirostat_tau,
            mirostat_eta=self.mirostat_eta,
            dry=defaults.dry(
                self.dry_multiplier,
                self.dry_base,
                self.dry_allowed_length,
                self.dry_penalty_last_n,
                self.dry_sequence_breakers,
            ),
            samplers=self.samplers,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            repetition_penalty=self.repetition_penalty,
            repeat_last_n=self.repeat_last_n,
            allowed_token_ids=tuple(self.allowed_token_ids) if self.allowed_token_ids else None,
        )


class CompletionFields(BaseModel):
    """The completions door's own fields. CompletionRequest lists this class after
    GenerationOptions, so pydantic (which orders fields by the reversed MRO) checks the prompt
    first: of several errors, a missing or bad prompt is the one named."""

    prompt: PromptInput = Field(
        description="text, token ids, or a list of either", json_schema_extra=PROMPT_SCHEMA
    )
    suffix: str | None = Field(
        None,
        max_length=MAX_TEXT_CHARS,
        description="text after the insertion point: the server builds the model's "
        "fill-in-the-middle prompt (prompt = the text before it)",
    )
    logprobs: StrictInt | None = Field(None, ge=0, validation_alias=alias("logprobs", "n_probs"))
    echo: StrictBool = False

    @field_validator("prompt")
    @classmethod
    def _prompt_not_empty(cls, prompt: PromptInput) -> PromptInput:
        if isinstance(prompt, list) and (not prompt or any(p == [] for p in prompt)):
            raise ValueError("prompt must not be an empty list")
        return prompt


class CompletionRequest(GenerationOptions, CompletionFields):
    """POST /v1/completions, in OpenAI's, llama.cpp's, mistral.rs's, Fireworks' and vLLM's names."""

    model_config = ConfigDict(
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
    limited_fields: ClassVar[dict[str, str]] = {**LIMITED_FIELDS, "logprobs": "max_logprobs"}

    max_tokens: StrictInt | None = Field(
        defaults.MAX_TOKENS,
        ge=-1,
        le=MAX_TOKENS_FIELD,
        validation_alias=alias("max_tokens", "n_predict", "max_completion_tokens"),
        description="-1 or null: until the context window is full; more than the context "
        "leaves, or than the server's limit, is lowered to it (400 under --strict-context)",
    )

    @classmethod
    def null_is_default(cls) -> frozenset[str]:
        return _NULL_IS_DEFAULT

    def to_request(self) -> Request:
        """The canonical request: the prompt as sent (FIM when a suffix comes with it), the
        constraint of any dialect's fields (mistral.rs's tools + tool_choice included)."""
        return self._request(
            logprobs=self.logprobs,
            echo=self.echo,
            constraint=constraint_of(self),
            prompt=self.prompt,
            suffix=self.suffix,
        )


def _keys_where_null_is_default(model: type[BaseModel]) -> frozenset[str]:
    keys = set()
    for name, info in model.model_fields.items():
        if info.default is not None and name != "max_tokens":
            keys.update(info.validation_alias.choices if info.validation_alias else [name])
    return frozenset(keys)


_SHARED_NULL_IS_DEFAULT = _keys_where_null_is_default(GenerationOptions)
_NULL_IS_DEFAULT = _keys_where_null_is_default(CompletionRequest)
