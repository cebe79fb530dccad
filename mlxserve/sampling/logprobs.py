"""Reading chosen-token logprobs and top-k alternatives off the device, in one transfer per step."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from ..text import CONTEXT_TOKENS


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

    def top_alternatives(
        self, ids_with_token: Sequence[int], row: LogprobRow, text: str
    ) -> dict[str, float]:
        """Top-k alternatives (text -> logprob) of the token ending `ids_with_token`, and it.

        Alternatives are rendered in the same context, so " foo" keeps its leading space.
        """
        context = list(ids_with_token[-CONTEXT_TOKENS - 1 : -1])
        top: dict[str, float] = {}
        for token_id, logprob in row.top[: self.k]:
            if math.isfinite(logprob):  # banned tokens (-inf) are no alternatives, nor valid JSON
                top.setdefault(self._text_after(context, token_id), logprob)
        top.setdefault(text, row.logprob)
        return top

    def _text_after(self, context: list[int], token_id: int) -> str:
        before = self.tokenizer.decode(context)
        return self.tokenizer.decode(context + [token_id])[len(before) :]
