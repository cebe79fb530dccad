"""Prompt forms -> token ids, and the context-length policy.

Accepted forms (OpenAI and llama.cpp): a string; a list of token ids; a list of strings (one
prompt each); a list of token-id lists; and llama.cpp's mixed list of strings and ids, which is ONE
prompt whose pieces are concatenated.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import groupby
from typing import Any

from .planning.defaults import fills_context


class PromptError(ValueError):
    """A prompt the model cannot take; `code` says why for the API's error body, `details` the
    numbers a client may read (llama.cpp's n_prompt_tokens and n_ctx)."""

    def __init__(
        self,
        message: str,
        code: str = "invalid_value",
        param: str = "prompt",
        details: dict[str, int] | None = None,
    ):
        super().__init__(message)
        self.code = code
        self.param = param
        self.details = details or {}


@dataclass(frozen=True)
class Prompt:
    ids: tuple[int, ...]
    text: str  # what echo returns: the string as sent, or the decoded ids


@dataclass(frozen=True)
class Budget:
    ids: tuple[int, ...]
    max_tokens: int
    truncated: bool  # prompt tokens were cut


def split_prompts(prompt: Any) -> list[Any]:
    """One entry per prompt: a string, or a list of ids/strings forming one prompt. In a list
    holding nested lists, each element (a string or a list) is one prompt, as llama.cpp reads
    `[[12, 34], "text"]`."""
    if isinstance(prompt, str):
        return [prompt]
    if all(isinstance(p, int) for p in prompt):
        return [prompt]
    if all(isinstance(p, str) for p in prompt):
        return list(prompt)
    if all(isinstance(p, (list, str)) for p in prompt):
        return list(prompt)  # lists of ids and strings: each one prompt (llama.cpp's mixed form)
    if all(isinstance(p, (int, str)) for p in prompt):
        return [prompt]  # llama.cpp's mixed form: one prompt
    raise PromptError("prompt lists must not mix nested lists with bare token ids")


def first_out_of_vocabulary(ids: list[int], vocab_size: int) -> int | None:
    return next((t for t in ids if not 0 <= t < vocab_size), None)


def tokenize(piece: Any, tokenizer: Any, vocab_size: int, document_start: int) -> Prompt:
    """Token ids for one prompt. Strings get the tokenizer's special tokens (BOS) once, up front."""
    if isinstance(piece, str):
        ids = list(tokenizer.encode(piece))
        text = piece
    else:
        ids = []
        for i, part in enumerate(piece):
            if isinstance(part, str):
                ids += tokenizer.encode(part, add_special_tokens=(i == 0))
            else:
                ids.append(part)
        bad = first_out_of_vocabulary(ids, vocab_size)
        if bad is not None:
            raise PromptError(f"token id {bad} is outside the vocabulary [0, {vocab_size})")
        text = piece if isinstance(piece, str) else _decode(tokenizer, piece)
    if not ids:
        # An empty prompt starts a new document, as "" does for OpenAI's models.
        ids = [document_start]
    return Prompt(tuple(ids), text)


def _decode(tokenizer: Any, piece: list) -> str:
    """Echo text for an id (or mixed) prompt: runs of ids decoded together, strings as sent."""
    return "".join(
        "".join(run) if is_text else tokenizer.decode(list(run), skip_special_tokens=True)
        for is_text, run in groupby(piece, key=lambda part: isinstance(part, str))
    )


def fit_context(
    ids: tuple[int, ...],
    max_tokens: int | None,
    context_length: int,
    truncate: bool,
    keep_last: int | None = None,
    max_prompt_tokens: int | None = None,
    max_new_tokens: int | None = None,
    strict: bool = False,
    keep_first: int = 0,
) -> Budget:
    """Make prompt + completion fit the context window and the server's limits.

    max_tokens None or -1 means "until the window is full" (or `max_new_tokens`, the server's
    ceiling). A larger max_tokens than the window leaves, or than the ceiling, is lowered to
    it, as llama.cpp, LM Studio and Ollama do; `strict` makes it an error naming the numbers,
    as OpenAI does. A prompt that leaves no room is an error unless `truncate`: then the oldest
    prompt tokens go. `keep_last` (vLLM's truncate_prompt_tokens) keeps only the prompt's last
    N tokens up front; so does `max_prompt_tokens` with `truncate`. Wherever the prompt is cut,
    its first `keep_first` tokens stay (llama.cpp's n_keep, Ollama's num_keep), before its end.
    """
    truncated = False
    if keep_last is not None and len(ids) > keep_last:
        ids, truncated = _cut(ids, keep_last, keep_first), True
    if max_prompt_tokens is not None and len(ids) > max_prompt_tokens:
        if not truncate:
            raise PromptError(
                f"The prompt is {len(ids)} tokens; this server accepts at most "
                f"{max_prompt_tokens}. Shorten it, or send "
                f'"context_length_exceeded_behavior": "truncate" to keep its end.',
                code="prompt_too_long",
                details={"n_prompt_tokens": len(ids), "n_ctx": context_length},
            )
        ids, truncated = _cut(ids, max_prompt_tokens, keep_first), True
    room = context_length - len(ids)
    if fills_context(max_tokens):
        if room >= 1:
            return Budget(ids, min(room, max_new_tokens or room), truncated)
        max_tokens = 1
    elif max_new_tokens is not None and max_tokens > max_new_tokens:
        if strict:
            raise PromptError(
                f"max_tokens is {max_tokens}; this server generates at most {max_new_tokens} "
                "tokens per sequence.",
                code="max_tokens_exceeded",
                param="max_tokens",
            )
        max_tokens = max_new_tokens
    if len(ids) + max_tokens <= context_length:
        return Budget(ids, max_tokens, truncated)
    if room >= 1 and (truncate or not strict):
        return Budget(ids, room, truncated)
    if not truncate:
        raise _overflow(len(ids), max_tokens, context_length, strict)
    max_tokens = min(max_tokens, 1)
    return Budget(_cut(ids, context_length - max_tokens, keep_first), max_tokens, True)


def _cut(ids: tuple[int, ...], limit: int, keep_first: int) -> tuple[int, ...]:
    """`limit` tokens of the prompt: its first `keep_first` (at most all but one of them), then
    its end."""
    head = min(keep_first, limit - 1)
    return ids[:head] + ids[len(ids) - (limit - head) :]


def _overflow(prompt_tokens: int, max_tokens: int, context_length: int, strict: bool):
    details = {"n_prompt_tokens": prompt_tokens, "n_ctx": context_length}
    if prompt_tokens < context_length and strict:
        return PromptError(
            f"This model's maximum context length is {context_length} tokens, but "
            f"{prompt_tokens + max_tokens} were requested ({prompt_tokens} in the prompt, "
            f"{max_tokens} for the completion). Shorten the prompt, lower max_tokens, or send "
            f'"context_length_exceeded_behavior": "truncate".',
            code="context_length_exceeded",
            details=details,
        )
    return PromptError(
        f"The prompt is {prompt_tokens} tokens, and this model's context is {context_length}: "
        "no room is left to generate. Shorten the prompt, or send "
        '"context_length_exceeded_behavior": "truncate" to keep its end.',
        code="context_length_exceeded",
        details=details,
    )
