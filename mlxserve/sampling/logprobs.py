"""Reading chosen-token logprobs and top-k alternatives off the device, in one transfer per step."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from ..text import CONTEXT_TOKENS
from .alternative import Alternative


@dataclass
class LogprobRow:
    token_id: int
    logprob: float
    top: list[tuple[int, float]]  # the k most likely tokens, most likely first


class LogprobReader:
    """Turns logprob rows into OpenAI-style entries with token texts, for one sequence."""

    def __init__(self, tokenizer: Any, k: int):
        self.tokenizer = tokenizer
        self.k = k

    @staticmethod
    def read_rows(logprobs: mx.array, tokens: Sequence[int], k: int) -> list[LogprobRow]:
        """`logprobs` [N, V] with the chosen `tokens` [N]: one device round trip for all rows."""
        index = mx.array(list(tokens))[:, None]
        chosen = mx.take_along_axis(logprobs, index, axis=-1)[:, 0]
        if k > 0:
            top_ids = mx.argsort(-logprobs, axis=-1)[:, :k]
            top_values = mx.take_along_axis(logprobs, top_ids, axis=-1)
            mx.eval(chosen, top_ids, top_values)
            ids, values = top_ids.tolist(), top_values.tolist()
        else:
            ids = values = [[] for _ in tokens]
        return [
            LogprobRow(token, logprob, list(zip(row_ids, row_values)))
            for token, logprob, row_ids, row_values in zip(tokens, chosen.tolist(), ids, values)
        ]

    def alternatives(self, ids_with_token: Sequence[int], row: LogprobRow) -> list[Alternative]:
        """The top-k alternatives of the token ending `ids_with_token`, most likely first, each
        rendered in the same context (so " foo" keeps its leading space). Banned tokens (-inf)
        are no alternatives, nor valid JSON."""
        context = list(ids_with_token[-CONTEXT_TOKENS - 1 : -1])
        return [
            Alternative(token_id, self._text_after(context, token_id), logprob)
            for token_id, logprob in row.top[: self.k]
            if math.isfinite(logprob)
        ]

    @staticmethod
    def by_text(alternatives: list[Alternative], text: str, logprob: float) -> dict[str, float]:
        """OpenAI's form: text -> logprob, the chosen token's `text` included."""
        top: dict[str, float] = {}
        for alternative in alternatives:
            top.setdefault(alternative.text, alternative.logprob)
        top.setdefault(text, logprob)
        return top

    def _text_after(self, context: list[int], token_id: int) -> str:
        before = self.tokenizer.decode(context)
        return self.tokenizer.decode(context + [token_id])[len(before) :]
