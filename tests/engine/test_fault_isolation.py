"""One failing sequence fails alone: a row made to fail in its sampler, its grammar, its
detokenizer or the batch's pass (tests/faults.py) gets an error event naming the cause, while
the sequences beside it in the batch produce exactly what they produce alone, and the engine
goes on serving."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from mlxserve.engine import Engine
from mlxserve.sampling.grammars import Constraint
from mlxserve.sampling.params import SamplingParams

from ..faults import Fault, with_fault
from .test_engine import collect, request, token_ids

pytestmark = pytest.mark.usefixtures("faults")

SAMPLED = SamplingParams(temperature=1.0)
PROMPTS = [(1, 5, 9, 13, 17), (2, 4, 6, 8), (3, 7, 11, 15, 19, 23)]


@pytest.fixture(scope="module")
def engine(tiny_model):
    engine = Engine(str(tiny_model)).start()
    assert engine.wait_ready(300)
    yield engine
    engine.stop()


def neighbours() -> list:
    return [
        request(prompt, max_tokens=16, sampling=SAMPLED, seed=7 + i)
        for i, prompt in enumerate(PROMPTS)
    ]


async def side_by_side(engine: Engine, groups: list[list]) -> list[dict]:
    return await asyncio.gather(*(collect(engine, group) for group in groups))


def failing(engine: Engine, stage: str):
    sampling = SAMPLED
    if stage == "grammar":
        schema = Constraint("test", "json_schema", '{"type": "object"}')
        sampling = replace(SAMPLED, grammar=engine.loaded.grammars.compile(schema))
    return with_fault(
        request((5, 6, 7, 8, 9), max_tokens=16, sampling=sampling, seed=3), Fault(stage, 3)
    )


@pytest.mark.parametrize("stage", ["sampler", "grammar", "detokenizer", "forward", "prefill"])
def test_a_row_failing_in_its_step_fails_alone(engine, stage):
    alone = [asyncio.run(collect(engine, [r]))[0] for r in neighbours()]
    groups = [[r] for r in neighbours()]
    groups.insert(1, [failing(engine, stage)])
    results = asyncio.run(side_by_side(engine, groups))
    failed = results.pop(1)[0]
    assert failed[-1].error and stage in failed[-1].error and "injected fault" in failed[-1].error
    assert len(token_ids(failed)) <= 4  # it failed where it was told to
    for group, solo in zip(results, alone):
        events = group[0]
        assert [e.error for e in events] == [None] * len(events)
        assert token_ids(events) == token_ids(solo) and len(token_ids(events)) == 16
    assert engine.stats.failed_sequences >= 1
    # The engine thread lives on and serves the next request as before.
    again = asyncio.run(collect(engine, [neighbours()[0]]))[0]
    assert token_ids(again) == token_ids(alone[0])


def test_a_failing_choice_ends_its_request_but_not_its_neighbours(engine):
    """n choices of one request: the failing one gets the error; its group's others finish."""
    group = [neighbours()[0], failing(engine, "sampler"), neighbours()[2]]
    events = asyncio.run(collect(engine, group))
    assert events[1][-1].error
    assert events[0][-1].finish_reason == "length" and events[2][-1].finish_reason == "length"


def many_neighbours(count: int, length: int = 5) -> list:
    return [
        request(
            tuple(range(10 + 7 * i, 10 + 7 * i + length)),
            max_tokens=12,
            sampling=SAMPLED,
            seed=20 + i,
        )
        for i in range(count)
    ]


@pytest.mark.parametrize("stage", ["forward", "prefill"])
def test_the_failing_row_is_found_among_many(engine, stage):
    """Nine rows in the failing pass: halving finds the one, the eight others are held out of
    the batch and back in as the search goes, and still produce what they produce alone."""
    others = many_neighbours(8)
    alone = [asyncio.run(collect(engine, [r]))[0] for r in others]
    failed_before = engine.stats.failed_sequences
    groups = [[r] for r in many_neighbours(8)]
    faulty = with_fault(request((90, 91, 92, 93), max_tokens=12, seed=1), Fault(stage, 5))
    groups.insert(5, [faulty])
    results = asyncio.run(side_by_side(engine, groups))
    failed = results.pop(5)[0]
    assert "injected fault" in failed[-1].error
    assert engine.stats.failed_sequences == failed_before + 1  # no one else was blamed
    for group, solo in zip(results, alone):
        assert [e.error for e in group[0]] == [None] * len(group[0])
        assert token_ids(group[0]) == token_ids(solo)


def test_a_long_prompt_failing_in_its_prefill_fails_alone(engine):
    """A long prompt's chunks ride in the streams' decode passes (mixed batches): the pass that
    carries one fails, the streams' step is undone and taken again without it."""
    streams = many_neighbours(3)
    alone = [asyncio.run(collect(engine, [r]))[0] for r in streams]
    long_prompt = tuple(range(100, 700))
    groups = [[r] for r in many_neighbours(3)]
    groups.append([with_fault(request(long_prompt, max_tokens=4, seed=2), Fault("prefill"))])
    results = asyncio.run(side_by_side(engine, groups))
    assert "prefill" in results.pop()[0][-1].error
    for group, solo in zip(results, alone):
        assert token_ids(group[0]) == token_ids(solo)
    again = asyncio.run(collect(engine, [request(long_prompt, max_tokens=4)]))[0]
    assert again[-1].error is None and len(token_ids(again)) == 4
