"""Every default a request starts from, and what each special value means, written once.

The sampler's own defaults are `SamplingParams`' and `DryParams'` (sampling/params.py, the
engine's side of the boundary): OpenAI's neutral settings and llama.cpp's DRY. The doors read
them from here, with the dialects' own defaults and the rules for -1, null and on/off switches.
"""

from __future__ import annotations

import secrets
from dataclasses import replace

from ..sampling.params import DryParams, SamplingParams

# OpenAI's defaults: every sampler off but the temperature's draw.
SAMPLING = SamplingParams()
# DRY's settings while it is off (dry_multiplier 0): llama.cpp's (common/common.h), which
# GET /slots shows as llama.cpp does.
DRY = DryParams(multiplier=0.0)
# llama.cpp's /completion and /infill (common/common.h's common_params_sampling).
LLAMACPP_SAMPLING = replace(SAMPLING, temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)
# Ollama's DefaultOptions (its api/types.go): what a request without `options` samples with.
OLLAMA_SAMPLING = replace(SAMPLING, temperature=0.8, top_k=40, top_p=0.9, repetition_penalty=1.1)

# Ollama's num_keep: a cut prompt keeps its first 4 tokens (after BOS), as Ollama's runner does.
OLLAMA_NUM_KEEP = 4

MAX_TOKENS = 16  # OpenAI's /v1/completions; chat and the other doors fill the context
LLAMACPP_MAX_TOKENS = -1  # llama.cpp's n_predict: until the context window is full


def no_parameters() -> dict[str, object]:
    """The parameters' schema of a tool that declares none: an object."""
    return {"type": "object"}


def fills_context(max_tokens: int | None) -> bool:
    """null, llama.cpp's -1 and Ollama's num_predict -1 or -2: generate until the model ends or
    the context window is full."""
    return max_tokens is None or max_tokens < 0


def until_full(max_tokens: int | None) -> int | None:
    """A client's max_tokens as planning reads it: None where it fills the context."""
    return None if fills_context(max_tokens) else max_tokens


def kept_tokens(n_keep: int) -> int | None:
    """llama.cpp's n_keep and Ollama's num_keep: the prompt's first tokens that stay when it is
    cut; -1 (any negative) keeps all it can (None)."""
    return None if n_keep < 0 else n_keep


def logprobs_k(logprobs: bool | None, top_logprobs: int | None) -> int | None:
    """OpenAI chat's and Ollama's logprobs (a switch, then alternatives per token) as the
    engine's one number: None when off, else the alternatives per token (0: the chosen one's)."""
    return (top_logprobs or 0) if logprobs else None


def top_k(value: int) -> int:
    """The sampler's top_k: 0 and llama.cpp's -1 are both off."""
    return max(value, 0)


def random_seed(seed: int | None) -> int:
    """The seed a request's sequences start from: null and llama.cpp's -1 draw a random one."""
    return seed if seed not in (None, -1) else secrets.randbits(64)


def dry(
    multiplier: float, base: float, allowed_length: int, penalty_last_n: int, breakers: list[str]
) -> DryParams | None:
    """DRY's settings, or None while it is off (a multiplier of 0, or a window of 0 tokens;
    -1 is the whole context)."""
    if multiplier <= 0 or penalty_last_n == 0:
        return None
    return DryParams(multiplier, base, allowed_length, penalty_last_n, tuple(breakers))
