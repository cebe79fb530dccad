"""The prefix KV cache: finished and cancelled sequences' KV states, reused by later prompts.

A later prompt that shares any token prefix with a stored sequence (not only an exact repeat)
starts from a copy of that KV, trimmed to the shared part. mlx-lm's `LRUPromptCache` does the
trie search, the trimming and the byte-budgeted LRU eviction; this wraps it for one model.
"""

from __future__ import annotations

from typing import Any

from mlx_lm.models.cache import LRUPromptCache, can_trim_prompt_cache, trim_prompt_cache

from ..settings import machine_memory_bytes

MODEL_KEY = "active"  # one model per engine: the cache is dropped with it
MAX_ENTRIES = 256
DEFAULT_SHARE_OF_MEMORY = 8  # 1/8 of the machine's memory, at most MAX_DEFAULT_BYTES
MAX_DEFAULT_BYTES = 8 << 30


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

    def fetch(self, prompt: list[int]) -> tuple[list[Any] | None, int]:
        """A private copy of the KV for the longest stored prefix of `prompt`, and its length.

        At least the last prompt token is left to compute: its logits give the first token.
        """
        self.lookups += 1
        cache, rest = self._lru.fetch_nearest_cache(MODEL_KEY, list(prompt))
        if cache is None:
            return None, 0
        if not rest:  # an exact repeat: recompute the last token
            if not can_trim_prompt_cache(cache):
                return None, 0
            trim_prompt_cache(cache, 1)
            rest = prompt[-1:]
        reused = len(prompt) - len(rest)
        self.hits += 1
        self.reused_tokens += reused
        return cache, reused

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
