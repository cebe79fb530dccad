"""Prompt forms and the context-length policy."""

from __future__ import annotations

import pytest

from mlxserve.prompt import PromptError, fit_context, split_prompts


@pytest.mark.parametrize(
    ("prompt", "count"),
    [
        ("a", 1),
        ([1, 2, 3], 1),
        (["a", "b"], 2),
        ([[1], [2, 3]], 2),
        (["a", 5, "b"], 1),
        ([["a", 5], [6]], 2),
        ([[12, 34], "text"], 2),  # llama.cpp: each element one prompt
        ([[12, 34, "a"], [5], "b"], 3),
    ],
)
def test_split_prompts(prompt, count):
    assert len(split_prompts(prompt)) == count


def test_nested_lists_beside_bare_ids_are_refused():
    with pytest.raises(PromptError):
        split_prompts([5, [1]])


def test_fit_context_cases():
    ids = tuple(range(100))
    assert fit_context(ids, 20, 128, truncate=False).max_tokens == 20
    assert fit_context(ids, None, 128, truncate=False).max_tokens == 28
    assert fit_context(ids, -1, 128, truncate=False).max_tokens == 28
    clamped = fit_context(ids, 50, 128, truncate=False)  # llama.cpp's, LM Studio's, Ollama's
    assert (clamped.max_tokens, clamped.truncated) == (28, False)
    assert fit_context(ids, 50, 128, truncate=False, max_new_tokens=10).max_tokens == 10
    with pytest.raises(PromptError) as caught:  # OpenAI's
        fit_context(ids, 50, 128, truncate=False, strict=True)
    assert caught.value.code == "context_length_exceeded"
    assert caught.value.details == {"n_prompt_tokens": 100, "n_ctx": 128}
    with pytest.raises(PromptError) as caught:
        fit_context(ids, 50, 128, truncate=False, max_new_tokens=40, strict=True)
    assert (caught.value.code, caught.value.param) == ("max_tokens_exceeded", "max_tokens")
    with pytest.raises(PromptError) as caught:  # no room at all, whatever max_tokens
        fit_context(tuple(range(128)), 5, 128, truncate=False)
    assert caught.value.details == {"n_prompt_tokens": 128, "n_ctx": 128}
    shrunk = fit_context(ids, 50, 128, truncate=True)
    assert (len(shrunk.ids), shrunk.max_tokens, shrunk.truncated) == (100, 28, False)
    long = tuple(range(200))
    cut = fit_context(long, 10, 128, truncate=True)
    assert cut.ids == long[-127:] and cut.max_tokens == 1
    kept = fit_context(long, 10, 128, truncate=True, keep_last=50)
    assert kept.ids == long[-50:] and kept.max_tokens == 10
    scoring = fit_context(long, 0, 128, truncate=True)
    assert len(scoring.ids) == 128 and scoring.max_tokens == 0


def test_a_cut_prompt_keeps_its_first_tokens_when_asked():
    """llama.cpp's n_keep, Ollama's num_keep: the first tokens stay in front of the end."""
    long = tuple(range(200))
    kept = fit_context(long, 10, 128, truncate=True, keep_last=50, keep_first=5)
    assert kept.ids == long[:5] + long[-45:] and kept.truncated
    cut = fit_context(long, 10, 128, truncate=True, keep_first=3)
    assert cut.ids == long[:3] + long[-124:] and cut.max_tokens == 1
    every = fit_context(long, 10, 128, truncate=True, keep_first=len(long))
    assert every.ids == long[:126] + long[-1:]  # all that fit, and the prompt's last token
    whole = fit_context(tuple(range(100)), 10, 128, truncate=True, keep_first=5)
    assert whole.ids == tuple(range(100)) and not whole.truncated
