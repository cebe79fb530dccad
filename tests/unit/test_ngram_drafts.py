"""Prompt-lookup drafts follow the latest earlier occurrence of the longest n-gram that ends the
sequence, never the end itself, and keep up as tokens arrive."""

from __future__ import annotations

import random

import pytest

from mlxserve.speculation.ngram import NgramDrafter


def brute_force(tokens: list[int], limit: int, n_min: int, n_max: int) -> list[int]:
    """The definition, searched directly: for the longest n first, the latest start i < len - n
    where tokens[i:i+n] equals the last n tokens; what follows it, copied one token at a time
    from the sequence as the copy extends it."""
    for n in range(min(n_max, len(tokens)), n_min - 1, -1):
        tail = tokens[-n:]
        for i in range(len(tokens) - n - 1, -1, -1):
            if tokens[i : i + n] == tail:
                extended = list(tokens)
                for k in range(limit):
                    extended.append(extended[i + n + k])
                return extended[len(tokens) :]
    return []


def test_code_repeated_from_the_prompt_is_drafted():
    prompt = [5, 6, 7, 8, 9, 10, 11, 12]  # "def f(x): return x + 1"
    drafter = NgramDrafter(prompt + [1, 2, 5, 6])  # the answer starts writing it again
    assert drafter.draft(4) == [7, 8, 9, 10]
    # past the end, the copy goes on from itself: the answer as if it repeated again
    assert drafter.draft(12) == [7, 8, 9, 10, 11, 12, 1, 2, 5, 6, 7, 8]
    drafter.extend([7, 8])
    assert drafter.draft(2) == [9, 10]


def test_the_longest_ngram_wins_then_the_latest_occurrence():
    drafter = NgramDrafter([1, 2, 3, 40, 9, 2, 3, 50, 1, 2, 3], n_min=2, n_max=3)
    assert drafter.draft(1) == [40]  # "1 2 3" (n=3) beats the later "2 3" (n=2)
    drafter = NgramDrafter([2, 3, 40, 2, 3, 50, 2, 3], n_min=2, n_max=3)
    assert drafter.draft(1) == [50]  # the latest "2 3" before the end


def test_a_repeating_sequence_drafts_its_period_again():
    assert NgramDrafter([9, 4, 4, 4]).draft(5) == [4, 4, 4, 4, 4]
    assert NgramDrafter([9, 1, 2, 3, 1, 2, 3, 1, 2]).draft(5) == [3, 1, 2, 3, 1]


def test_no_earlier_occurrence_no_draft():
    assert NgramDrafter([1, 2, 3, 4]).draft(5) == []
    assert NgramDrafter([]).draft(5) == []
    assert NgramDrafter([1, 2, 1, 2]).draft(0) == []


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError):
        NgramDrafter(n_min=3, n_max=2)
    with pytest.raises(ValueError):
        NgramDrafter(n_min=0)


@pytest.mark.parametrize("seed", range(20))
def test_it_equals_the_definition_as_tokens_arrive(seed):
    rng = random.Random(seed)
    vocabulary = rng.choice([3, 5, 50])  # few symbols: many matches; many: few
    n_min = rng.randint(1, 3)
    n_max = n_min + rng.randint(0, 3)
    drafter, tokens = NgramDrafter(n_min=n_min, n_max=n_max), []
    for _ in range(300):
        token = rng.randrange(vocabulary)
        drafter.append(token)
        tokens.append(token)
        limit = rng.randint(1, 8)
        assert drafter.draft(limit) == brute_force(tokens, limit, n_min, n_max)
