"""A decode step's tokens with rows that draw alike in one graph: per-row sampler calls cost a
few small ops each, which add up to more than a small model's forward pass at batch 16.

A sampler with a `group_key` (not None) and a `draw_rows(members, logprobs)` joins the rows whose
samplers share that key; any other sampler is called on its own row, as mlx-lm does.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

import mlx.core as mx


def draw(samplers: Sequence[Callable], logprobs: mx.array) -> mx.array:
    """`[B]` tokens, row i drawn by `samplers[i]` from `logprobs[i]` (`[B, V]`)."""
    if all(s is samplers[0] for s in samplers):  # one sampler for the batch (as mlx-lm does)
        return samplers[0](logprobs)
    groups: dict[Hashable, list[int]] = {}
    for row, sampler in enumerate(samplers):
        key = getattr(sampler, "group_key", None)
        groups.setdefault(("alone", row) if key is None else ("group", key), []).append(row)
    parts, order = [], []
    for (kind, _), rows in groups.items():
        if len(rows) == len(samplers):
            part = logprobs
        elif len(rows) == 1:
            part = logprobs[rows[0] : rows[0] + 1]
        else:
            part = logprobs[mx.array(rows)]
        first = samplers[rows[0]]
        if kind == "group":
            parts.append(first.draw_rows([samplers[r] for r in rows], part))
        else:
            parts.append(first(part))
        order += rows
    tokens = parts[0] if len(parts) == 1 else mx.concatenate(parts)
    if order == sorted(order):
        return tokens
    inverse = sorted(range(len(order)), key=order.__getitem__)
    return tokens[mx.array(inverse)]
