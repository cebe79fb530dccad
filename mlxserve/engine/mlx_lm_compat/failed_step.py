"""A step that raised, undone in mlx-lm's `BatchGenerator`, so that its rows can go on without
the one that made it fail.

A decode pass that raises part-way has written this step's KV into some layers and not others;
its sampled tokens are not yet taken (mlx-lm samples a step ahead), so putting each layer's
write position back makes the batch what it was before the step. A prompt pass that raises leaves
the prompt batch's caches in no known state, so every prompt not yet decoding leaves the batch,
to start again. A decode row can also step out of the batch (`pause`) with its KV and its token
sampled but not yet sent, and come back later (`resume`) exactly where it was.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache

from .batch_join import KVGroups


@dataclass
class StepCheckpoint:
    """The decode batch before a step: its rows and each layer's write position."""

    decode_uids: list[int]
    positions: list[tuple[BatchKVCache, int, Any]]  # (layer, _idx, offset)
    carried_uids: list[int]  # prompts whose chunk the decode pass will carry (mixed batches)
    next_tokens: Any  # the tokens the step feeds, sampled by the step before
    next_logprobs: list
    contexts: list[int]  # each row's logits processors' token context, its length


def _decode_layers(generator) -> list[BatchKVCache]:
    layers = []
    for layer in generator._generation_batch.prompt_cache:
        layers += layer.groups if isinstance(layer, KVGroups) else [layer]
    return [c for c in layers if isinstance(c, BatchKVCache)]


def checkpoint(generator) -> StepCheckpoint:
    """Taken before each step: references and integers, nothing copied."""
    mixed = generator.mixed
    batch = generator._generation_batch
    return StepCheckpoint(
        decode_uids=list(batch.uids),
        positions=[(c, c._idx, c.offset) for c in _decode_layers(generator)],
        carried_uids=list(generator._prompt_batch.uids) if mixed is not None else [],
        next_tokens=batch._next_tokens,
        next_logprobs=batch._next_logprobs,
        contexts=[context._size for context in batch._token_context],
    )


def restore(generator, point: StepCheckpoint) -> None:
    """The decode batch as before the step: each layer's write position (the failed step's
    writes are overwritten by the next one), the tokens it feeds, its processors' contexts."""
    for cache, idx, offset in point.positions:
        cache._idx, cache.offset = idx, offset
    batch = generator._generation_batch
    batch._next_tokens, batch._next_logprobs = point.next_tokens, point.next_logprobs
    for context, size in zip(batch._token_context, point.contexts):
        context._size = size
    if generator.planner is not None:  # its indexes may hold the failed step's token
        generator.planner.reset()


def drop_prompts(generator, decoding: set[int]) -> None:
    """Every row but the decode rows `decoding` out of the batch, its caches dropped: the
    prompts being prefilled, those waiting, and any that joined the decode batch in the failed
    step. A chunk kept for the next pass is dropped too."""
    if generator.mixed is not None:
        generator.mixed.abandon()
    uids = [seq[0] for seq in generator._unprocessed_sequences]
    uids += generator._prompt_batch.uids
    uids += [u for u in generator._generation_batch.uids if u not in decoding]
    if uids:
        generator.remove(uids)
    generator._currently_processing = []  # a split that raised leaves it out of step


@dataclass
class PausedRow:
    """A decode row out of the batch: its KV, its tokens so far, and the token sampled after
    them (not yet sent, `next_token`, with its `logprobs`)."""

    cache: list
    tokens: list[int]
    next_token: int
    logprobs: mx.array
    remaining: int  # tokens it may still generate, the next one included
    sampler: Any
    processors: list
    stop: Any


def pause(generator, uid: int) -> PausedRow:
    """Take decode row `uid` out of the batch (a restored one: see `restore`)."""
    batch = generator._generation_batch
    i = batch.uids.index(uid)
    row = PausedRow(
        cache=[],
        tokens=[],
        next_token=int(batch._next_tokens[i].item()),
        logprobs=batch._next_logprobs[i],
        remaining=batch.max_tokens[i] - batch._num_tokens[i],
        sampler=batch.samplers[i],
        processors=batch.logits_processors[i],
        stop=batch.stop_sequences[i],
    )
    row.cache, row.tokens = generator.remove([uid], return_prompt_caches=True)[uid]
    row.tokens = list(row.tokens)
    mx.eval(row.logprobs, [(c.keys, c.values) for c in row.cache])
    return row


def resume(generator, row: PausedRow) -> int:
    """Put a paused row back, its `next_token` sent already; its new uid. Its first pass feeds
    that token, as the step it left would have."""
    (uid,) = generator.insert(
        [[row.next_token]],
        max_tokens=[row.remaining - 1],
        caches=[row.cache],
        all_tokens=[list(row.tokens)],
        samplers=[row.sampler],
        logits_processors=[row.processors],
        stop_sequences=[row.stop],
    )
    return uid
