"""Copies of running prompts for the prefix cache, a few layers per engine step
(`engine/prefix/memory.RunningPromptCopies`): the copy is the prompt's KV, in buffers of its own."""

from __future__ import annotations

import random

import mlx.core as mx
from mlx_lm.generate import BatchGenerator

from mlxserve.engine.prefix.memory import RunningPromptCopies


def test_a_running_prompt_is_copied_a_layer_a_step(tiny_lm):
    rng = random.Random(3)
    prompt = [rng.randrange(3, 1024) for _ in range(70)]
    generator = BatchGenerator(tiny_lm, prefill_step_size=32)
    generator.insert([list(range(3, 93))], max_tokens=[60])  # a longer row: ours is left-padded
    (uid,) = generator.insert([prompt], max_tokens=[40])
    batch = generator._generation_batch
    while uid not in batch.uids:
        generator.next()
    tokens = list(batch.tokens[batch.uids.index(uid)])
    assert tokens == prompt  # the row's KV holds the whole prompt once it joins
    copies = RunningPromptCopies(budget_bytes=1)  # at least a layer a step
    copies.start(uid, tokens)
    layers = len(tiny_lm.layers)
    done = []
    for _ in range(layers):
        assert not done and len(copies) == 1
        generator.next()  # the row decodes on, its prompt's positions unchanged
        done = copies.advance(batch)
    assert len(copies) == 0
    [(copied_tokens, cache)] = done
    assert copied_tokens == prompt and len(cache) == layers
    row = batch.extract_cache(batch.uids.index(uid))
    for copy, layer in zip(cache, row):
        assert copy.offset == len(prompt) < layer.offset
        assert mx.array_equal(copy.keys, layer.keys[..., : len(prompt), :])
        assert mx.array_equal(copy.values, layer.values[..., : len(prompt), :])
    generator.close()


def test_a_job_is_dropped_when_its_sequence_leaves(tiny_lm):
    generator = BatchGenerator(tiny_lm, prefill_step_size=32)
    (uid,) = generator.insert([[5, 6, 7, 8]], max_tokens=[3])
    batch = generator._generation_batch
    while uid not in batch.uids:
        generator.next()
    copies = RunningPromptCopies(budget_bytes=1)
    copies.start(uid, batch.tokens[0])
    generator.remove([uid])
    assert copies.advance(batch) == [] and len(copies) == 0
    generator.close()
