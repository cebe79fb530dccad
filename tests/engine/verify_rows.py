"""What the rollback tests share: a verify pass's rows decoded on after it, held to the same
rows decoded alone from only the tokens each kept (tests/engine/test_speculation_rollback.py
for plain KV, test_state_rollback.py for caches that cannot be trimmed)."""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from ..device_numerics import LOGPROB_TOLERANCE


def alone(model, tokens: list[int], steps: int) -> list[mx.array]:
    """The logits of `steps` greedy steps after `tokens`, one sequence."""
    cache = make_prompt_cache(model)
    logits = model(mx.array(tokens)[None], cache=cache)[0, -1]
    out = []
    for _ in range(steps):
        out.append(logits)
        logits = model(mx.argmax(logits)[None, None], cache=cache)[0, -1]
    return out


def decoded_after(model, caches, verify: mx.array, kept: list[int], steps: int):
    """Each row's logits for `steps` greedy steps, from its last kept position of the verify
    pass's logits `verify` on, decoded in the batch of `caches`."""
    logits = verify[mx.arange(len(kept)), mx.array(kept) - 1]
    out: list[list[mx.array]] = [[] for _ in kept]
    for _ in range(steps):
        for row, row_logits in enumerate(logits):
            out[row].append(row_logits)
        logits = model(mx.argmax(logits, axis=-1)[:, None], cache=caches)[:, -1]
    return out


def assert_each_decodes_as_alone(model, together, prompts, fed, kept, steps: int) -> None:
    for row, (prompt, row_fed, row_kept) in enumerate(zip(prompts, fed, kept)):
        reference = alone(model, prompt + row_fed[:row_kept], steps)
        for step, (ours, theirs) in enumerate(zip(together[row], reference)):
            assert mx.argmax(ours).item() == mx.argmax(theirs).item(), (row, step)
            assert mx.allclose(ours, theirs, atol=LOGPROB_TOLERANCE).item(), (row, step)
