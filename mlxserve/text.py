"""Incremental detokenizing and stop-string matching.

Text is produced as the difference between decoding a short window of tokens with and without the
newest one, so every tokenizer (SentencePiece, byte-level BPE, byte fallback) yields exact deltas
and an incomplete UTF-8 sequence is held back until it completes. Stop strings are matched on text
and any tail that could still become a stop string is held back, so none is split across chunks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

# Tokens of context kept before the window: enough for any tokenizer to decode a boundary right.
CONTEXT_TOKENS = 6
INCOMPLETE = "\ufffd"


class Decoder(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = ...) -> str: ...


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas, one call per new token."""

    def __init__(
        self, tokenizer: Decoder, context: Sequence[int], skip_special_tokens: bool = True
    ):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids = list(context[-CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add(self, token: int) -> str:
        """Append one token; return the text it completes (possibly empty)."""
        self.ids.append(token)
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.ids[self.prefix_offset :])
        if len(full) > len(prefix) and not full.endswith(INCOMPLETE):
            delta = full[len(prefix) :]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            return delta
        return ""

    def flush(self) -> str:
        """Text still held back at the end (an incomplete byte sequence), as decoded."""
        if self.read_offset == len(self.ids):
            return ""
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.ids[self.prefix_offset :])
        self.read_offset = len(self.ids)
        return full[len(prefix) :]


@dataclass
class StopResult:
    text: str  # text that can be released now
    stopped: bool  # a stop string matched; nothing after `text` may be emitted
    matched: str | None = None  # which stop string


class StopMatcher:
    """Finds stop strings in streamed text, releasing only text that cannot start a stop string."""

    def __init__(self, stops: Sequence[str], include_stop: bool = False):
        self.stops = [s for s in stops if s]
        self.include_stop = include_stop
        self.pending = ""
        self.longest = max((len(s) for s in self.stops), default=0)

    def feed(self, text: str, active: bool = True) -> StopResult:
        """Add text. With `active` false (min_tokens not reached) stops are not matched yet."""
        self.pending += text
        if not self.stops:
            out, self.pending = self.pending, ""
            return StopResult(out, False)
        if active:
            hit = self._earliest_match()
            if hit is not None:
                start, stop = hit
                end = start + len(stop) if self.include_stop else start
                out, self.pending = self.pending[:end], ""
                return StopResult(out, True, stop)
        keep = self._held_back_length() if active else 0
        cut = len(self.pending) - keep
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return StopResult(out, False)

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out

    def _earliest_match(self) -> tuple[int, str] | None:
        best: tuple[int, str] | None = None
        for stop in self.stops:
            i = self.pending.find(stop)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, stop)
        return best

    def _held_back_length(self) -> int:
        """Length of the longest tail of pending text that is a proper prefix of a stop string."""
        limit = min(len(self.pending), self.longest - 1)
        for n in range(limit, 0, -1):
            tail = self.pending[-n:]
            if any(stop.startswith(tail) for stop in self.stops):
                return n
        return 0


class LineRules:
    """llama.cpp's line-based limits for editor infill, on released text.

    Tracks whether a line break was generated (t_max_predict_ms only stops after one), and with
    `min_indent` (n_indent) ends the text at the first later line indented less, cut before that
    line's first other character: the completion stays inside the block being written.
    """

    def __init__(self, min_indent: int = 0):
        self.min_indent = min_indent
        self.seen_newline = False
        self._indent: int | None = None  # spaces/tabs so far on the current line, None: decided

    def feed(self, text: str) -> StopResult:
        for i, char in enumerate(text):
            if char == "\n" and self._indent is None:
                self.seen_newline = True
                self._indent = 0
            elif self._indent is not None:
                if char in " \t":
                    self._indent += 1
                    continue
                if self._indent < self.min_indent:
                    return StopResult(text[:i], True)
                self._indent = 0 if char == "\n" else None
        return StopResult(text, False)
