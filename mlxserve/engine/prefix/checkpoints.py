"""Where a prompt's whole cache state is kept, for a model whose caches cannot be cut back to a
shared prefix (a sliding window's ring, a linear-attention or state-space layer's state:
mlx_lm_compat/cache_kinds.py).

Such a cache is reused only by prompts that extend exactly the tokens it holds. So the prompt
goes into mlx-lm's batch in segments (its prefill stops at each segment's end) ending where a
later prompt is likely to go on from: each mark the front set (a chat's system prompt and its
last message end: planning/chat.py), every `CHECKPOINT_EVERY` positions of a long prompt (one
that shares only a part of it resumes from the last checkpoint it shares), and all but its last
token (an exact repeat, or a later turn that extends it). At each segment's end the engine
copies the row's state into the prefix cache (`PrefixKeeper.keep_checkpoint`).
"""

from __future__ import annotations

from collections.abc import Iterable

# Prompt positions between two checkpoints of a long prompt: each holds the KV of the model's
# attention layers up to it, so a long prompt's checkpoints add up to a few times its own KV.
CHECKPOINT_EVERY = 4096


def checkpoint_positions(length: int, start: int, marks: Iterable[int]) -> list[int]:
    """The positions of a prompt of `length` tokens, read from `start` on (the rest came from
    the prefix cache), after which its state is kept: `marks`, each multiple of
    CHECKPOINT_EVERY, and `length - 1`."""
    every = range(CHECKPOINT_EVERY, length, CHECKPOINT_EVERY)
    wanted = {*marks, *every, length - 1}
    return sorted(p for p in wanted if start < p <= length - 1)


def segments(prompt: list[int], start: int, marks: Iterable[int]) -> list[list[int]]:
    """`prompt[start:]` cut at its checkpoint positions: the segments mlx-lm's
    `insert_segments` takes, the last one the prompt's last token alone."""
    cuts = [start, *checkpoint_positions(len(prompt), start, marks), len(prompt)]
    return [prompt[a:b] for a, b in zip(cuts, cuts[1:]) if b > a]
