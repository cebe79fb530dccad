"""SamplingParams: the validated, immutable sampling settings of one sequence."""

from __future__ import annotations

from dataclasses import dataclass, field

from .breakers import DEFAULT_BREAKERS, Breakers

DEFAULT_REPEAT_LAST_N = 64
# llama.cpp's default chain (common/common.h), by its sampler names.
DEFAULT_SAMPLERS = (
    "penalties",
    "dry",
    "top_n_sigma",
    "top_k",
    "typ_p",
    "top_p",
    "min_p",
    "xtc",
    "temperature",
)
# Other names llama.cpp accepts for the same samplers.
SAMPLER_ALIASES = {"typical_p": "typ_p", "typical": "typ_p", "temp": "temperature"}
# llama.cpp's one-letter form ("samplers": "dkypmxt").
SAMPLER_LETTERS = {
    "e": "penalties",
    "d": "dry",
    "s": "top_n_sigma",
    "k": "top_k",
    "y": "typ_p",
    "p": "top_p",
    "m": "min_p",
    "x": "xtc",
    "t": "temperature",
    "i": "infill",
}


@dataclass(frozen=True)
class DryParams:
    """DRY's settings, llama.cpp's names and defaults (REFERENCE §1)."""

    multiplier: float
    base: float = 1.75
    allowed_length: int = 2
    penalty_last_n: int = 64  # -1 = whole context, 0 = off
    breakers: tuple[str, ...] = DEFAULT_BREAKERS


@dataclass(frozen=True)
class SamplingParams:
    """What the sampler chain does for one sequence. Validated at the API edge, never mutated."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    typical_p: float = 1.0
    top_n_sigma: float = -1.0
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    dynatemp_range: float = 0.0
    dynatemp_exponent: float = 1.0
    mirostat: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    logit_bias: dict[int, float] = field(default_factory=dict)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    repeat_last_n: int = DEFAULT_REPEAT_LAST_N
    dry: DryParams | None = None
    dry_breakers: Breakers | None = None  # resolved against the vocabulary when dry is on
    allowed_token_ids: tuple[int, ...] | None = None
    samplers: tuple[str, ...] = DEFAULT_SAMPLERS
    # Tokens that end a fill-in-the-middle (EOS first, then the FIM end tokens): the "infill"
    # sampler's; empty when it is not in `samplers`.
    infill_end_ids: tuple[int, ...] = ()
    grammar: str | None = None  # a compiled llguidance grammar (sampling/grammars.py); None = free

    @property
    def greedy(self) -> bool:
        """Temperature 0 keeps only the top token, mirostat or not (as llama.cpp's temp sampler)."""
        return self.temperature == 0.0
