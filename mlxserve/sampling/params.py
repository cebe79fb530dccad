"""SamplingParams: the validated, immutable sampling settings of one sequence."""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_REPEAT_LAST_N = 64


@dataclass(frozen=True)
class SamplingParams:
    """What the sampler chain does for one sequence. Validated at the API edge, never mutated."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    repeat_last_n: int = DEFAULT_REPEAT_LAST_N
    allowed_token_ids: tuple[int, ...] | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
