"""Prompt chunks carried in decode steps' forward passes (`engine/mixed_batch.py`): the same
tokens as mlx-lm's own separate prefill passes, and log-probabilities equal to float32 rounding."""

from __future__ import annotations

import random

import mlx.core as mx
import pytest
from mlx_lm.generate import BatchGenerator, PromptProcessingBatch

from mlxserve.engine import mixed_batch

from .batch_decoding import decode_all


def _prompt(rng: random.Random, length: int) -> list[int]:
    return [rng.randrange(3, 1024) for _ in range(length)]


def _scenarios() -> dict[str, dict]:
    rng = random.Random(7)
    return {
        # a stream; a long prompt prefilled beside it; two prompts prefilled together
        "beside a stream": {
            0: ([_prompt(rng, 12)], [120]),
            4: ([_prompt(rng, 400)], [40]),
            30: ([_prompt(rng, 50), _prompt(rng, 200)], [20, 20]),
        },
        # the stream ends while the prompt is still being prefilled
        "the stream ends first": {0: ([_prompt(rng, 8)], [4]), 2: ([_prompt(rng, 300)], [10])},
        # the stream is removed (a client left) with a chunk kept: the chunk runs alone first
        "the stream is removed": {0: ([_prompt(rng, 8)], [100]), 2: ([_prompt(rng, 300)], [10])},
    }


def _removing_the_first_at(step: int):
    steps = [0]

    def next_step(generator: BatchGenerator):
        steps[0] += 1
        if steps[0] == step:
            generator.remove([0])
        return generator.next()

    return next_step


def _decode(model, name: str, mixed: bool):
    generator = BatchGenerator(model, prefill_step_size=32)
    carrier = None
    if mixed:
        carrier = mixed_batch.MixedBatches(generator, max_chunk=64)
    next_step = BatchGenerator.next
    if name == "the stream is removed":
        next_step = _removing_the_first_at(6)
    tokens, logprobs = decode_all(generator, _scenarios()[name], next_step, max_steps=500)
    return tokens, logprobs, carrier


def test_the_tiny_model_is_supported(tiny_lm):
    assert mixed_batch.supports(tiny_lm)


@pytest.mark.parametrize("name", list(_scenarios()))
def test_decoding_is_mlx_lms(tiny_lm, monkeypatch, name):
    monkeypatch.setattr(PromptProcessingBatch, "prompt", mixed_batch._prompt)
    with_mixing = _decode(tiny_lm, name, mixed=True)
    monkeypatch.setattr(PromptProcessingBatch, "prompt", mixed_batch._mlx_lm_prompt)
    plain = _decode(tiny_lm, name, mixed=False)
    assert with_mixing[0] == plain[0]
    assert mx.abs(with_mixing[1] - plain[1]).max().item() < 1e-4
    carrier = with_mixing[2]
    assert carrier.carried_tokens >= (400 if name == "beside a stream" else 64)
    assert (carrier.flushed_tokens > 0) == (name == "the stream is removed")
