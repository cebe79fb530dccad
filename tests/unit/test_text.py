"""Incremental detokenizing and stop-string matching (pure Python, on the tiny tokenizer)."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from mlxserve.text import IncrementalDetokenizer, StopMatcher

SAMPLES = [
    "def f(x):\n    return x  # done",
    "héllo wörld ✓ 日本語 🎉",
    "  leading spaces and\ttabs\n\n",
    "a",
]


@pytest.fixture(scope="module")
def hf_tokenizer(tiny_model):
    return AutoTokenizer.from_pretrained(str(tiny_model))


@pytest.mark.parametrize("text", SAMPLES)
def test_deltas_add_up_to_the_decoded_text(hf_tokenizer, text):
    ids = hf_tokenizer.encode(text, add_special_tokens=False)
    prompt = hf_tokenizer.encode("x = 1\n")
    detok = IncrementalDetokenizer(hf_tokenizer, prompt)
    deltas = [detok.add(t) for t in ids]
    out = "".join(deltas) + detok.flush()
    assert (
        out
        == hf_tokenizer.decode(prompt + ids, skip_special_tokens=True)[
            len(hf_tokenizer.decode(prompt, skip_special_tokens=True)) :
        ]
    )
    assert not any("\ufffd" in d for d in deltas)  # incomplete bytes wait for their completion


def test_stop_matcher_holds_back_a_possible_stop_and_releases_it_when_ruled_out():
    m = StopMatcher(["END"])
    assert m.feed("abc E").text == "abc "
    assert m.feed("N").text == ""
    result = m.feed("X")
    assert result.text == "ENX" and not result.stopped


def test_stop_matcher_cuts_at_the_earliest_stop():
    m = StopMatcher(["yz", "b"])
    result = m.feed("xyzab")
    assert result.stopped and result.text == "x"


def test_stop_matcher_include_stop():
    result = StopMatcher(["</s>"], include_stop=True).feed("done</s>more")
    assert result.stopped and result.text == "done</s>"


def test_stop_matcher_inactive_releases_everything():
    m = StopMatcher(["ab"])
    result = m.feed("xxab", active=False)
    assert result.text == "xxab" and not result.stopped
