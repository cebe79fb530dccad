"""A request's inputs (a string, strings, token ids, lists of token ids) as token rows for
the model, each checked: nothing empty, nothing outside the vocabulary, nothing longer than
the model reads unless the request lets it be truncated. Each failure is a 400 naming it."""

from __future__ import annotations

from typing import Any

from ..errors import InvalidRequest

MAX_INPUTS = 2048  # inputs one request may carry (OpenAI's limit)


def input_rows(
    value: Any, loaded, param: str = "input", truncate: bool = False, prompt_name=None
) -> tuple[list[list[int]], int]:
    """(token rows, the tokens they hold) for `value`, in the order given; texts after the
    model's instruction `prompt_name` (None: its default one, if it has one)."""
    items = _items(value, param)
    prefix = instruction(loaded, prompt_name)
    if prefix:
        items = [prefix + item if isinstance(item, str) else item for item in items]
    if len(items) > MAX_INPUTS:
        raise InvalidRequest(
            f"'{param}' has {len(items)} inputs; at most {MAX_INPUTS} may be sent at once",
            param=param,
        )
    rows = []
    limit = loaded.context_length
    for index, item in enumerate(items):
        where = param if len(items) == 1 and not isinstance(value, list) else f"{param}[{index}]"
        row = _tokens(item, loaded, where, limit if truncate else None)
        if len(row) > limit:
            raise InvalidRequest(
                f"'{where}' is {len(row)} tokens long; {loaded.model_id} reads at most {limit} "
                "tokens an input (shorten it, or send truncate: true where the route has it)",
                param=param,
                code="context_length_exceeded",
            )
        rows.append(row)
    return rows, sum(map(len, rows))


def instruction(loaded, prompt_name: str | None) -> str:
    """The text put before each input: the model's prompt by that name (sentence-transformers'
    `prompt_name`: "query", "document", ...), else its default prompt, else nothing."""
    if prompt_name is None:
        return loaded.prompts.get(loaded.default_prompt, "") if loaded.default_prompt else ""
    if prompt_name not in loaded.prompts:
        known = ", ".join(sorted(loaded.prompts)) or "none"
        raise InvalidRequest(
            f"{loaded.model_id} has no prompt named {prompt_name!r} (it has: {known})",
            param="prompt_name",
        )
    return loaded.prompts[prompt_name]


def _items(value: Any, param: str) -> list[Any]:
    """The inputs: a string or a token list is one; a list of them is many."""
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise InvalidRequest(
            f"'{param}' must be a string, a list of strings, a list of token ids or a list "
            "of lists of token ids",
            param=param,
        )
    if not value:
        raise InvalidRequest(f"'{param}' is an empty list: send at least one input", param=param)
    if all(_is_token(v) for v in value):
        return [value]
    return value


def _tokens(item: Any, loaded, where: str, truncate_to: int | None) -> list[int]:
    if isinstance(item, str):
        if not item:
            raise InvalidRequest(f"'{where}' is an empty string", param=where.split("[")[0])
        hf = loaded.tokenizer._tokenizer
        if truncate_to is None:
            return list(hf.encode(item))
        return list(hf.encode(item, truncation=True, max_length=truncate_to))
    if isinstance(item, list) and item and all(_is_token(t) for t in item):
        outside = [t for t in item if not 0 <= t < loaded.vocab_size]
        if outside:
            raise InvalidRequest(
                f"'{where}' has token id {outside[0]}, outside the vocabulary (0 to "
                f"{loaded.vocab_size - 1})",
                param=where.split("[")[0],
            )
        return item[:truncate_to] if truncate_to is not None else list(item)
    if isinstance(item, list) and not item:
        raise InvalidRequest(f"'{where}' is an empty list of tokens", param=where.split("[")[0])
    raise InvalidRequest(
        f"'{where}' must be a string or a list of token ids (integers)", param=where.split("[")[0]
    )


def _is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
