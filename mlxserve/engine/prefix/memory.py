"""The prefix KV cache: finished and cancelled sequences' KV states, reused by later prompts.

A later prompt that shares any token prefix with a stored sequence (not only an exact repeat)
starts from a copy of that KV, trimmed to the shared part. mlx-lm's `LRUPromptCache` does the
trie search, the trimming and the byte-budgeted LRU eviction; this wraps it for one model.
A cache that cannot be trimmed (a sliding window past its size, a linear-attention state) is
a checkpoint: reused only by prompts that extend its tokens (`prefix/checkpoints.py`).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import (
    KVCache,
    LRUPromptCache,
    can_trim_prompt_cache,
    trim_prompt_cache,
)

from ...settings import machine_memory_bytes
from ..mlx_lm_compat.batch_join import row_view
from ..mlx_lm_compat.quantized_kv import empty_like

MODEL_KEY = "active"  # one model per engine: the cache is dropped with it
MAX_ENTRIES = 256
DEFAULT_SHARE_OF_MEMORY = 8  # 1/8 of the machine's memory, at most MAX_DEFAULT_BYTES
MAX_DEFAULT_BYTES = 8 << 30
# Bytes of a running prompt's KV copied out of the decode batch per engine step (at least one
# layer). Copied at once, a long prompt's KV held a stream beside it for many times its usual
# gap.
COPY_BUDGET_BYTES = 8 << 20


def default_budget_bytes() -> int:
    """A sane default from the machine's memory (unified on Apple Silicon)."""
    return min(machine_memory_bytes() // DEFAULT_SHARE_OF_MEMORY, MAX_DEFAULT_BYTES)


class PrefixCache:
    """KV states keyed by the tokens they hold, within a byte budget."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._lru = LRUPromptCache(max_size=MAX_ENTRIES, max_bytes=max_bytes)
        self.lookups = 0
        self.hits = 0
        self.reused_tokens = 0

    def fetch(self, prompt: list[int], count: bool = True) -> tuple[list[Any] | None, int]:
        """A private copy of the KV for the longest stored prefix of `prompt`, and its length.

        At least the last prompt token is left to compute: its logits give the first token.
        `count`: this is the lookup the request's statistics count (else `count` it later).
        """
        cache, rest = self._lru.fetch_nearest_cache(MODEL_KEY, list(prompt))
        reused = 0
        if cache is not None and not rest:  # an exact repeat: recompute the last token
            if can_trim_prompt_cache(cache):
                trim_prompt_cache(cache, 1)
                rest = prompt[-1:]
            else:  # a state cannot be cut: the checkpoint before the last token, if kept
                cache, rest = self._lru.fetch_nearest_cache(MODEL_KEY, list(prompt[:-1]))
                rest = [*rest, *prompt[-1:]] if cache is not None else rest
        if cache is not None:
            reused = len(prompt) - len(rest)
        if count:
            self.count(reused)
        return cache, reused

    def covered(self, prompt: list[int]) -> int:
        """How many of `prompt`'s tokens `fetch` would reuse, nothing copied (mlx-lm's trie
        search, as its `fetch_nearest_cache` makes it)."""
        found = self._lru._trie.search(MODEL_KEY, list(prompt))
        if found.exact is not None:
            entry = self._lru._trie.get(MODEL_KEY, found.exact)
            if can_trim_prompt_cache(entry.prompt_cache) or len(prompt) < 2:
                return len(prompt)
            return self.covered(prompt[:-1])
        shorter = len(found.shorter) if found.shorter is not None else 0
        if found.longer is not None and found.common_prefix > shorter:
            return found.common_prefix
        return shorter

    def count(self, reused: int) -> None:
        self.lookups += 1
        self.hits += reused > 0
        self.reused_tokens += reused

    def store(self, tokens: list[int], cache: list[Any] | None) -> None:
        """Keep `cache`, the KV of exactly `tokens`, for later prompts."""
        if tokens and cache:
            self._lru.insert_cache(MODEL_KEY, list(tokens), cache)

    @property
    def nbytes(self) -> int:
        return self._lru.nbytes

    @property
    def entries(self) -> int:
        return len(self._lru)


class RunningPromptCopies:
    """Copies, for the prefix cache, of prompts that have joined mlx-lm's decode batch and are
    still generating: a few layers per engine step, so a stream beside a long prompt never waits
    for the whole copy. Their KV must be copied (not shared): a buffer referenced from elsewhere
    cannot be updated in place, and each decode step would copy it instead.

    A prompt's first positions never change while its sequence generates, so layers copied at
    different steps still make one consistent cache.
    """

    def __init__(self, budget_bytes: int = COPY_BUDGET_BYTES):
        self.budget_bytes = budget_bytes
        self._jobs: dict[int, tuple[list[int], list[KVCache]]] = {}  # uid: (tokens, copied)

    def start(self, uid: int, tokens: list[int]) -> None:
        """Copy the KV of `tokens`, the first positions of the decode batch's row `uid`."""
        self._jobs[uid] = (list(tokens), [])

    def __len__(self) -> int:
        return len(self._jobs)

    def advance(self, batch) -> list[tuple[list[int], list[KVCache]]]:
        """Copy the next layers of the oldest job, within the byte budget, from `batch` (mlx-lm's
        `GenerationBatch`). Returns the (tokens, cache) of a job that is now complete, if any.
        A job whose sequence has left the batch is dropped (it was stored as it left)."""
        for uid in list(self._jobs):
            if uid not in batch.uids:
                del self._jobs[uid]
                continue
            return self._copy(batch, uid, self.budget_bytes)
        return []

    def finish(self, batch, uid: int) -> list[tuple[list[int], list[KVCache]]]:
        """Copy every layer of `uid`'s job now (someone is about to start from it)."""
        if uid not in self._jobs or uid not in batch.uids:
            return []
        return self._copy(batch, uid, None)

    def _copy(self, batch, uid: int, budget: int | None):
        tokens, copied = self._jobs[uid]
        layers, row = batch.prompt_cache, batch.uids.index(uid)
        fresh, spent = [], 0
        for layer in layers[len(copied) :]:
            if fresh and budget is not None and spent >= budget:
                break
            fresh.append(prefix_copy(row_view(layer, row), len(tokens)))
            spent += fresh[-1].nbytes
        mx.eval([(c.keys, c.values) for c in fresh])  # nothing may hold the batch's buffers
        copied += fresh
        if len(copied) < len(layers):
            return []
        del self._jobs[uid]
        return [(tokens, copied)]


def prefix_copy(layer: KVCache, length: int) -> KVCache:
    """The first `length` positions of `layer` in buffers of their own (`mx.array` always copies;
    `mx.contiguous` shares a slice that happens to be contiguous)."""
    copy = empty_like(layer)
    copy.keys = mx.array(layer.keys[..., :length, :])
    copy.values = mx.array(layer.values[..., :length, :])
    copy.offset = length
    return copy
