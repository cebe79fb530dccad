"""DRY sequence breakers, resolved against a vocabulary as llama.cpp does (REFERENCE §1).

Pure Python (no mlx): run once per (tokenizer, breakers) and cached, off the engine thread.
- A token whose text contains a whole breaker string is a single-token breaker.
- A token whose text ends with a proper prefix of a breaker starts a multi-token breaker; the rest
  of the breaker, tokenized (at most MAX_TAIL_TOKENS), must follow it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

MAX_BREAKER_CHARS = 40
MAX_TAIL_TOKENS = 20
DEFAULT_BREAKERS = ("\n", ":", '"', "*")


@dataclass(frozen=True)
class Breakers:
    single: frozenset[int]  # tokens that are breakers by themselves
    multi: tuple[tuple[tuple[int, ...], frozenset[int]], ...]  # (tail tokens, head tokens)


def resolve_breakers(tokenizer: Any, breakers: Sequence[str]) -> Breakers:
    return _resolve(_TokenizerKey(tokenizer), tuple(b[:MAX_BREAKER_CHARS] for b in breakers if b))


class _TokenizerKey:
    """Hashable by identity, so the cache holds one entry per loaded tokenizer."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer

    def __hash__(self) -> int:
        return id(self.tokenizer)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _TokenizerKey) and other.tokenizer is self.tokenizer


@lru_cache(maxsize=32)
def _resolve(key: _TokenizerKey, breakers: tuple[str, ...]) -> Breakers:
    tokenizer = key.tokenizer
    pieces = token_texts(tokenizer)
    single: set[int] = set()
    multi: dict[tuple[int, ...], set[int]] = {}
    for token_id, text in enumerate(pieces):
        for breaker in breakers:
            if breaker in text:
                single.add(token_id)
                continue
            start = text.find(breaker[0])
            while start >= 0:
                overlap = text[start:]
                start = text.find(breaker[0], start + 1)
                if len(overlap) < len(breaker) and breaker.startswith(overlap):
                    rest = breaker[len(overlap) :]
                    tail = tuple(tokenizer.encode(rest, add_special_tokens=False))
                    if tail:
                        multi.setdefault(tail[:MAX_TAIL_TOKENS], set()).add(token_id)
    return Breakers(
        frozenset(single), tuple((tail, frozenset(heads)) for tail, heads in sorted(multi.items()))
    )


@lru_cache(maxsize=8)
def _texts(key: _TokenizerKey) -> tuple[str, ...]:
    tokenizer = key.tokenizer
    size = len(tokenizer.get_vocab()) if hasattr(tokenizer, "get_vocab") else len(tokenizer.vocab)
    return tuple(tokenizer.batch_decode([[i] for i in range(size)]))


def token_texts(tokenizer: Any) -> tuple[str, ...]:
    """Every token's text, decoded alone (cached per tokenizer)."""
    return _texts(_TokenizerKey(tokenizer))
