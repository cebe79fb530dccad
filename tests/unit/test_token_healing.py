"""Token healing: which prompt ends are healed, which tokens may write the healed text again,
and the mask lifting once it is written."""

from __future__ import annotations

import mlx.core as mx

from mlxserve.sampling.healing_mask import HealingMask
from mlxserve.sampling.token_healing import TokenTexts, heal

# id:        0    1    2      3     4        5     6      7       8          9     10
TEXTS = ["", " ", "  ", " x", "\n  ", "return", "  y", "x", " return", "\n", "\n\t"]


def test_only_a_last_token_of_whitespace_is_healed():
    texts = TokenTexts(TEXTS)
    assert heal([5, 1], texts) == ([5], " ")
    assert heal([5, 2], texts) == ([5], "  ")
    # A line break with indentation (one token): the model writes it again with what follows.
    assert heal([5, 4], texts) == ([5], "\n  ")
    assert heal([5, 10], texts) == ([5], "\n\t")
    assert heal([5, 9], texts) == ([5, 9], "")  # a line break alone: the model's own FIM start
    assert heal([1, 5], texts) == ([1, 5], "")
    assert heal([0], texts) == ([0], "")  # a special token has no text
    assert heal([], texts) == ([], "")


def test_the_next_tokens_start_with_the_healed_text_or_begin_it():
    texts = TokenTexts(TEXTS)
    assert sorted(texts.continuing(" ").tolist()) == [1, 2, 3, 6, 8]
    # "  " is written by "  ", "  y", or " " then a token starting with " "
    assert sorted(texts.continuing("  ").tolist()) == [1, 2, 6]


def test_the_mask_holds_until_the_text_is_written_again():
    texts = TokenTexts(TEXTS)
    mask = HealingMask("  ", texts, prompt_length=2)
    logits = mx.zeros((len(TEXTS),))
    allowed = mask(mx.array([5, 5]), logits)
    assert [i for i in range(len(TEXTS)) if allowed[i].item() == 0] == [1, 2, 6]
    allowed = mask(mx.array([5, 5, 1]), logits)  # " " written: one space still to come
    assert [i for i in range(len(TEXTS)) if allowed[i].item() == 0] == [1, 2, 3, 6, 8]
    assert mask(mx.array([5, 5, 1, 3]), logits).tolist() == logits.tolist()  # written: no mask
