"""Driving mlx-lm's own `BatchGenerator` to the end, for tests of what the engine changes in it."""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx
from mlx_lm.generate import BatchGenerator

from mlxserve.engine.mlx_lm_compat import ServerBatchGenerator


def decode_all(
    generator: BatchGenerator,
    inserts: dict[int, tuple[list[list[int]], list[int]]],
    next_step: Callable[[BatchGenerator], tuple[list, list]] = BatchGenerator.next,
    max_steps: int = 600,
) -> tuple[dict[int, list[int]], mx.array]:
    """Insert `inserts[step]` (prompts, max_tokens) before that step and run `next_step` until
    every sequence has ended. Returns the tokens per sequence and every response's
    log-probabilities, in order."""
    tokens: dict[int, list[int]] = {}
    logprobs = []
    last_insert = max(inserts)
    for step in range(max_steps):
        if step in inserts:
            generator.insert(*inserts[step])
        _, responses = next_step(generator)
        for r in responses:
            tokens.setdefault(r.uid, []).append(r.token)
            logprobs.append(r.logprobs)
        if step > last_insert and not responses:
            break
    generator.close()
    return tokens, mx.stack(logprobs)


def mixed_generator(model, prefill_step_size: int, max_chunk: int = 64, matmul_rows=None):
    """The engine's generator with mixed batches, in mlx-lm's shape: chunks of
    `prefill_step_size` run in passes of that size, and decode passes carry up to `max_chunk`
    (their matmuls on `matmul_rows(n)` rows). Returns (generator, its MixedBatches)."""
    generator = ServerBatchGenerator(
        model,
        prefill_chunk=prefill_step_size,
        pass_tokens=prefill_step_size,
        mixed_max_chunk=max_chunk,
        matmul_rows=matmul_rows,
    )
    assert generator.mixed is not None, "the model has no mixed forward pass"
    return generator, generator.mixed
