"""What the engine keeps in the prefix cache, and when: prompts copied out of the running batch
a few layers a step, and finished sequences' KV as they leave."""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.generate import generation_stream

from .prefix_cache import PrefixCache, RunningPromptCopies
from .stats import EngineStats


class PrefixKeeper:
    """The prefix cache of the loaded model (None when its budget is 0) and its running copies."""

    def __init__(self, budget_bytes: int, stats: EngineStats):
        self.budget_bytes = budget_bytes
        self.stats = stats
        self.cache: PrefixCache | None = None
        self.copies = RunningPromptCopies()
        self.reset()

    @property
    def enabled(self) -> bool:
        return self.cache is not None

    def reset(self) -> None:
        """An empty cache (KV of one model is no use to another)."""
        self.cache = PrefixCache(self.budget_bytes) if self.budget_bytes > 0 else None
        self.copies = RunningPromptCopies()
        self._count()

    def new_batch(self) -> None:
        """The batch was rebuilt: copies of its rows are gone with it."""
        self.copies = RunningPromptCopies()

    def fetch(self, prompt: list[int]):
        """(a private copy of the longest cached prefix's KV or None, its length)."""
        cache, reused = self.cache.fetch(prompt)
        self._count()
        return cache, reused

    def keep(self, tokens, cache) -> None:
        """Store `cache`, the KV of `tokens`; copied out of the batch's buffers now."""
        if self.cache is None or not tokens:
            return
        with mx.stream(generation_stream):  # with the model's work (and its collectives)
            mx.async_eval([c.state for c in cache])
        self.cache.store(list(tokens), cache)
        self._count()

    def advance_copies(self, decode_batch) -> None:
        """Copy the next layers of running prompts (within a step's byte budget)."""
        with mx.stream(generation_stream):
            for tokens, cache in self.copies.advance(decode_batch):
                self.keep(tokens, cache)

    def copy_running_prompt(self, decode_batch, uid: int, tokens: list[int], now: bool) -> None:
        """Start copying a prompt that just joined the decode batch; all at once when `now`
        (choices waiting for it start from it this step)."""
        if self.cache is None:
            return
        self.copies.start(uid, tokens)
        if now:
            for done_tokens, cache in self.copies.finish(decode_batch, uid):
                self.keep(done_tokens, cache)

    def _count(self) -> None:
        cache, stats = self.cache, self.stats
        if cache is None:
            stats.prefix_cache_bytes = 0
            return
        stats.prefix_lookups = cache.lookups
        stats.prefix_hits = cache.hits
        stats.prefix_reused_tokens = cache.reused_tokens
        stats.prefix_cache_bytes = cache.nbytes
