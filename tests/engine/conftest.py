"""Fixtures the engine tests share."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models.cache import make_prompt_cache


@pytest.fixture(scope="module")
def reference(tiny_lm):
    """mlx-lm's tiny model, greedy, one token a pass: a prompt's first `max_tokens` tokens."""

    def greedy(prompt, max_tokens: int) -> list[int]:
        cache = make_prompt_cache(tiny_lm)
        logits = tiny_lm(mx.array(prompt)[None], cache=cache)[0, -1]
        out = []
        for _ in range(max_tokens):
            out.append(int(mx.argmax(logits).item()))
            logits = tiny_lm(mx.array([out[-1:]]), cache=cache)[0, -1]
        return out

    return greedy
