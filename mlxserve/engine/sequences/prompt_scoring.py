"""Echo with logprobs: every prompt token's logprob, read while prefilling the prompt ourselves."""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.generate import generation_stream
from mlx_lm.models.cache import make_prompt_cache

from ...sampling.logprobs import LogprobReader
from ...text import IncrementalDetokenizer
from ..models.host import LoadedModel
from ..requests import TokenLogprob
from .state import describe

SCORING_CHUNK = 512  # prompt tokens per forward pass


def score_prompt(loaded: LoadedModel, prompt: list[int], reader: LogprobReader):
    """(KV cache of all but the last prompt token, each prompt token's TokenLogprob), so
    generation goes on from that cache. On mlx-lm's generation stream, with the rest of the
    model's work (and its collectives)."""
    with mx.stream(generation_stream):
        model = loaded.model
        cache = make_prompt_cache(model)
        texts = IncrementalDetokenizer(loaded.tokenizer, [])
        scored = [TokenLogprob(prompt[0], texts.add(prompt[0]), None)]
        for start in range(0, len(prompt) - 1, SCORING_CHUNK):
            chunk = prompt[start : min(start + SCORING_CHUNK, len(prompt) - 1)]
            logits = model(mx.array(chunk)[None], cache=cache)[0].astype(mx.float32)
            logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
            targets = prompt[start + 1 : start + 1 + len(chunk)]
            for row in LogprobReader.read_rows(logprobs, targets, reader.k):
                context = list(texts.ids)
                text = texts.add(row.token_id)
                scored.append(describe(reader, context + [row.token_id], row, text))
            mx.eval([c.state for c in cache])
    return cache, scored
