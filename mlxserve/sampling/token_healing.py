"""Token healing for fill-in-the-middle: a prefix that ends in whitespace (an editor's cursor
after `return `, or after a line's indentation) ends in a token the model rarely saw there,
since a byte-level BPE puts a word's leading space in the word's token and a line's indentation
in its newline's. The whitespace is taken off the prompt and the first tokens generated must
write it again, so the model picks `" x"` (or a line break and indentation with the word after
them) as it would in a file, and never ends a middle it has not begun.
"""

from __future__ import annotations

import bisect

import numpy as np

HEALED = " \t\r\n"  # a last token made only of these is healed


class TokenTexts:
    """Each token's text, and lookups by text: the tokens that start with a string, and those
    that are a string's beginning. Special tokens have no text here and never match."""

    def __init__(self, texts: list[str]):
        self.by_text: dict[str, list[int]] = {}
        for token, text in enumerate(texts):
            if text:
                self.by_text.setdefault(text, []).append(token)
        self.texts = texts
        order = sorted((t for t in range(len(texts)) if texts[t]), key=texts.__getitem__)
        self.sorted_texts = [texts[t] for t in order]
        self.sorted_ids = np.array(order, dtype=np.int32)

    def text(self, token: int) -> str:
        """A token's text; "" for special tokens and ids past the tokenizer's (padded rows)."""
        return self.texts[token] if token < len(self.texts) else ""

    @classmethod
    def of(cls, hf_tokenizer) -> TokenTexts:
        ids = [[token] for token in range(len(hf_tokenizer))]
        return cls(hf_tokenizer.batch_decode(ids, skip_special_tokens=True))

    def continuing(self, rest: str) -> np.ndarray:
        """Tokens that can come next while `rest` is still to be written: those that start
        with all of it, and those that are a beginning of it."""
        lo = bisect.bisect_left(self.sorted_texts, rest)
        hi = bisect.bisect_left(self.sorted_texts, rest + "\U0010ffff")
        beginnings = [t for k in range(1, len(rest)) for t in self.by_text.get(rest[:k], ())]
        return np.concatenate([self.sorted_ids[lo:hi], np.array(beginnings, dtype=np.int32)])


def heal(prefix: list[int], texts: TokenTexts) -> tuple[list[int], str]:
    """`prefix` without its last token when that token is whitespace ending in spaces or tabs
    (a line break and indentation included), and the text generation must then start with (""
    when nothing is healed). Line breaks alone stay: the model's own place to begin a middle."""
    if not prefix:
        return prefix, ""
    last = texts.text(prefix[-1])
    if not last or last.strip(HEALED) or last.endswith(("\n", "\r")):
        return prefix, ""
    return prefix[:-1], last
