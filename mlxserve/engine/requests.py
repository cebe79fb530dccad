"""What crosses the engine boundary: plain data, no HTTP and no MLX types."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ..sampling.alternative import Alternative
from ..sampling.params import SamplingParams

FinishReason = Literal["stop", "length"]
MAX_BATCH = 32  # sequences in one model's batch (llama.cpp's slots)


@dataclass(frozen=True)
class StopSpec:
    strings: tuple[str, ...] = ()
    token_ids: tuple[int, ...] = ()
    include_in_output: bool = False
    min_tokens: int = 0
    ignore_eos: bool = False
    # llama.cpp's n_indent: after a line break, a line indented less than this ends the text.
    min_indent: int = 0
    # llama.cpp's t_max_predict_ms: once a line break was generated, time up ends the text.
    max_predict_ms: float | None = None
    # The server's request deadline (a time.monotonic() value): generation ends there ("length").
    deadline: float | None = None


@dataclass(frozen=True)
class GenerationRequest:
    """One sequence to generate. A completion with n prompts x best_of is a group of these."""

    prompt_ids: tuple[int, ...]
    max_tokens: int
    sampling: SamplingParams
    seed: int
    stop: StopSpec = StopSpec()
    logprobs: int | None = None  # top-k alternatives per token; 0 = only the chosen token's
    post_sampling_probs: bool = False  # logprobs of the distribution the token was drawn from
    prompt_logprobs: bool = False  # echo with logprobs: score the prompt too
    skip_special_tokens: bool = True
    cache_prompt: bool = True  # reuse and keep KV in the prefix cache; with max_tokens 0 the
    # prompt is still prefilled into the prefix cache (llama.cpp's warm-up request), unless echo
    # with logprobs scored it already.
    report_timings: bool = False  # every event carries the timings so far, not the last alone
    report_progress: bool = False  # events while the prompt is read (PromptProgress)
    healed: str = ""  # text token healing took off the prompt's end: generated first, not sent
    num_draft_tokens: int | None = None  # most drafts verified a pass (None: server's; 0: off)
    # A prompt with images (a vision model's): the images, encoded, and the prompt's text, one
    # placeholder an image, which the model's processor expands (prompt_ids are its tokens as
    # they are). The prefix cache keeps its KV under the images' digests (vision/tower.py).
    images: tuple[bytes, ...] = ()
    prompt_text: str = ""
    image_tokens: int = 0  # the tokens the images become (prompt_ids hold a placeholder each)
    # Prompt positions a later prompt is likely to continue from (a chat's message ends): a
    # model whose caches cannot be trimmed keeps its state there (prefix/checkpoints.py).
    checkpoints: tuple[int, ...] = ()


INVALID_IMAGE = "invalid_image"  # an error event's code: the model's processor refused an image


def kv_tokens(requests) -> int:
    """KV positions a group may fill: each sequence's prompt (its images' tokens too) plus its
    max_tokens."""
    return sum(len(r.prompt_ids) + r.image_tokens + r.max_tokens for r in requests)


@dataclass
class TokenLogprob:
    token_id: int
    text: str
    logprob: float | None  # None for the first prompt token, which nothing predicts
    top: dict[str, float] = field(default_factory=dict)  # text -> logprob, the token's own too
    alternatives: list[Alternative] = field(default_factory=list)  # the top k by id, in order


@dataclass(frozen=True)
class Timings:
    """One sequence's time: prompt processing up to its first token, then decoding."""

    prompt_tokens: int  # computed, not taken from the prefix cache
    cached_tokens: int
    prompt_ms: float
    generated_tokens: int
    decode_ms: float
    draft_tokens: int = 0  # drafted and verified (speculative decoding)
    draft_accepted: int = 0  # of them, kept


@dataclass(frozen=True)
class PromptProgress:
    """How far the prompt's reading has come (llama.cpp's prompt_progress)."""

    total: int  # the prompt's tokens
    cache: int  # taken from the prefix cache
    processed: int  # read so far, the cached ones included
    time_ms: float  # since the sequence started


@dataclass
class GenerationEvent:
    """Progress of one sequence (`index` = its place in the submitted group)."""

    index: int
    text: str = ""
    tokens: list[TokenLogprob] = field(default_factory=list)  # filled when logprobs were asked
    token_ids: list[int] = field(default_factory=list)  # the generated tokens this event adds
    prompt_tokens: list[TokenLogprob] | None = None  # once, first, when prompt_logprobs
    cumulative_logprob: float = 0.0
    finish_reason: FinishReason | None = None
    stopping_word: str | None = None  # the stop string that ended the text, if one did
    completion_tokens: int = 0
    slot: int = -1  # the sequence's slot number (llama.cpp's id_slot)
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache (on the last event)
    timings: Timings | None = None  # on the last event (on every one with report_timings)
    prompt_progress: PromptProgress | None = None  # an event of its own, with report_progress
    error: str | None = None
    unavailable: bool = False  # the error is the server's state (503), not this request's
    code: str | None = None  # the error's code where it is not the usual one (engine_restarted)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None or self.error is not None


def token_rounds(pairs: list[tuple]) -> list[list[tuple]]:
    """A step's (response, sequence) pairs by round: every sequence's first token, then the
    second of those with more, and so on (each round's logprobs are read in one go)."""
    rounds: list[list[tuple]] = []
    seen: dict[int, int] = {}
    for pair in pairs:
        k = seen[id(pair[1])] = seen.get(id(pair[1]), -1) + 1
        if k == len(rounds):
            rounds.append([])
        rounds[k].append(pair)
    return rounds


@dataclass(frozen=True)
class RunningSlot:
    """A sequence in the batch as llama.cpp's GET /slots shows it."""

    slot: int
    group_id: int
    request: GenerationRequest
    generated: int
    seen_newline: bool
