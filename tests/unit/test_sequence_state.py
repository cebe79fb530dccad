"""`SequenceState.advance`: one generated token in, one event out, with a tokenizer and hand-made
responses (no model): stops, held-back text, warm-ups, llama.cpp's line rules."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from mlx_lm.utils import load_tokenizer

from mlxserve.engine import GenerationRequest, StopSpec
from mlxserve.engine.sequences.state import SequenceState
from mlxserve.sampling.params import SamplingParams


@dataclass
class Response:
    token: int
    finish_reason: str | None = None


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    return load_tokenizer(tiny_model)


def state(tokenizer, **stop) -> SequenceState:
    request = GenerationRequest(
        prompt_ids=(1,), max_tokens=50, sampling=SamplingParams(), seed=0, stop=StopSpec(**stop)
    )
    return SequenceState.start(0, request, lambda event: None, tokenizer)


def feed(seq: SequenceState, ids: list[int], last_reason: str | None = None):
    events = []
    for i, token in enumerate(ids):
        reason = last_reason if i == len(ids) - 1 else None
        events.append(seq.advance(Response(token, reason), None))
        if events[-1].finish_reason:
            break
    return events


def test_texts_add_up_to_the_decoded_tokens(tokenizer):
    ids = tokenizer.encode("def add(a, b):\n    return a + b\n", add_special_tokens=False)
    events = feed(state(tokenizer), ids, "length")
    assert "".join(e.text for e in events) == tokenizer.decode(ids)
    assert events[-1].finish_reason == "length" and events[-1].completion_tokens == len(ids)
    assert [t for e in events for t in e.token_ids] == ids
    assert events[-1].timings.generated_tokens == len(ids)


def test_a_stop_string_ends_the_text_before_it(tokenizer):
    ids = tokenizer.encode("x = 1\ny = 2\nz = 3\n", add_special_tokens=False)
    events = feed(state(tokenizer, strings=("y =",)), ids)
    assert events[-1].finish_reason == "stop" and events[-1].stopping_word == "y ="
    assert "".join(e.text for e in events) == "x = 1\n"


def test_a_stop_token_adds_no_text(tokenizer):
    ids = tokenizer.encode("print(1)", add_special_tokens=False)
    events = feed(state(tokenizer), [*ids, 2], "stop")
    assert events[-1].finish_reason == "stop" and events[-1].token_ids == []
    assert "".join(e.text for e in events) == "print(1)"


def test_a_warm_up_generates_nothing(tokenizer):
    seq = state(tokenizer)
    seq.prefill_only = True
    (event,) = feed(seq, [40])
    assert event.finish_reason == "length" and event.text == "" and event.completion_tokens == 0


def test_a_line_indented_less_than_n_indent_ends_the_text(tokenizer):
    ids = tokenizer.encode("if x:\n    a = 1\n    b = 2\nc = 3\n", add_special_tokens=False)
    events = feed(state(tokenizer, min_indent=4), ids)
    assert events[-1].finish_reason == "length"  # llama.cpp's limit stop
    assert "".join(e.text for e in events).rstrip("\n") == "if x:\n    a = 1\n    b = 2"
