"""Prompt-lookup drafts: the tokens that followed the latest earlier occurrence of a sequence's
last n tokens, in its own prompt and output (llama.cpp's `--spec-type ngram`, vLLM's `ngram`).

Code being edited repeats its prompt, so these drafts are often right, and cost no model. The
index is kept as tokens arrive: a few dictionary writes a token, a lookup per draft, however
long the sequence.
"""

from __future__ import annotations

from collections.abc import Iterable

DEFAULT_NGRAM_MIN = 2  # shorter n-grams match too often by chance to be worth a draft
DEFAULT_NGRAM_MAX = 4
MAX_NGRAM = 16  # longer runs cost lookups and almost never match where shorter ones do not


class NgramDrafter:
    """One sequence's tokens and, for each n-gram (n from `n_min` to `n_max`), where its latest
    occurrence ended, counting only occurrences that are not the sequence's current end."""

    def __init__(
        self,
        tokens: Iterable[int] = (),
        n_min: int = DEFAULT_NGRAM_MIN,
        n_max: int = DEFAULT_NGRAM_MAX,
    ):
        if not 1 <= n_min <= n_max:
            raise ValueError(f"n-gram sizes {n_min}..{n_max}: need 1 <= min <= max")
        self.n_min, self.n_max = n_min, n_max
        self.tokens: list[int] = []
        self._ends: dict[tuple[int, ...], int] = {}
        self.extend(tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        for token in tokens:
            self.append(token)

    def append(self, token: int) -> None:
        """`token` after the others. The n-grams that ended the sequence until now are indexed
        first: from now on they are earlier occurrences."""
        tokens, end = self.tokens, len(self.tokens)
        for n in range(self.n_min, min(self.n_max, end) + 1):
            self._ends[tuple(tokens[end - n :])] = end
        tokens.append(token)

    def draft(self, limit: int) -> list[int]:
        """`limit` tokens that followed the longest n-gram ending the sequence that occurred
        before; [] when none did. Where they reach the sequence's end, the copy goes on from
        what it copied (a repeating sequence drafts its period over and over), as a copy that
        overlaps its source does."""
        tokens = self.tokens
        if limit <= 0:
            return []
        for n in range(min(self.n_max, len(tokens)), self.n_min - 1, -1):
            end = self._ends.get(tuple(tokens[-n:]))
            if end is not None:
                out = tokens[end : end + limit]
                period = len(tokens) - end
                while len(out) < limit:
                    out.append(out[len(out) - period])
                return out
        return []
