"""`Engine.submit` with the tiny model and no HTTP: what every front door builds on."""

from __future__ import annotations

import asyncio
import math
import time

import mlx.core as mx
import mlx_lm
import pytest
from mlx_lm.sample_utils import make_sampler

from mlxserve.engine import Engine, EngineError, GenerationRequest, StopSpec
from mlxserve.sampling.params import SamplingParams

from ..device_numerics import LOGPROB_TOLERANCE

GREEDY = SamplingParams(temperature=0.0)
PROMPT = (1, 40, 41, 42, 43, 44, 45, 46)


@pytest.fixture(scope="module")
def engine(tiny_model):
    engine = Engine(str(tiny_model)).start()
    assert engine.wait_ready(300), engine.error
    yield engine
    engine.stop()


def request(prompt=PROMPT, max_tokens=12, sampling=GREEDY, seed=0, **kwargs) -> GenerationRequest:
    stop = kwargs.pop("stop", StopSpec(ignore_eos=True))
    return GenerationRequest(
        prompt_ids=tuple(prompt),
        max_tokens=max_tokens,
        sampling=sampling,
        seed=seed,
        stop=stop,
        **kwargs,
    )


async def collect(engine: Engine, requests):
    events = {}
    async for event in engine.submit(requests):
        events.setdefault(event.index, []).append(event)
    return events


def run(engine: Engine, requests):
    return asyncio.run(collect(engine, requests))


def token_ids(events) -> list[int]:
    return [t for e in events for t in e.token_ids]


def mlx_lm_greedy(model_path, prompt, max_tokens: int) -> list[int]:
    model, tokenizer = mlx_lm.load(str(model_path))
    out = mlx_lm.stream_generate(
        model, tokenizer, mx.array(prompt), max_tokens=max_tokens, sampler=make_sampler(0.0)
    )
    return [r.token for r in out]


def test_greedy_tokens_are_mlx_lms(engine, tiny_model):
    events = run(engine, [request(max_tokens=12)])[0]
    assert token_ids(events) == mlx_lm_greedy(tiny_model, PROMPT, 12)
    last = events[-1]
    assert last.finish_reason == "length" and last.completion_tokens == 12
    assert last.timings is not None and last.timings.generated_tokens == 12
    assert "".join(e.text for e in events) == engine.loaded.tokenizer.decode(token_ids(events))


def test_a_group_shares_its_prompt_and_each_choice_has_its_seed(engine):
    sampling = SamplingParams(temperature=1.0)
    alone = [run(engine, [request(sampling=sampling, seed=s)])[0] for s in (7, 8)]
    together = run(engine, [request(sampling=sampling, seed=s) for s in (7, 8)])
    assert token_ids(together[0]) == token_ids(alone[0])
    assert token_ids(together[1]) == token_ids(alone[1])
    assert token_ids(alone[0]) != token_ids(alone[1])


def test_a_repeated_prompt_comes_from_the_prefix_cache(engine):
    prompt = (1, *range(100, 160))
    run(engine, [request(prompt=prompt, max_tokens=2)])
    last = run(engine, [request(prompt=prompt, max_tokens=2)])[0][-1]
    assert last.cached_tokens >= len(prompt) - 2
    assert last.timings.prompt_tokens == len(prompt) - last.cached_tokens


def test_a_stop_string_ends_the_text_and_is_held_back(engine):
    whole = "".join(e.text for e in run(engine, [request(max_tokens=12)])[0])
    word = whole[3:6]
    events = run(engine, [request(max_tokens=12, stop=StopSpec(strings=(word,), ignore_eos=True))])
    last = events[0][-1]
    assert last.finish_reason == "stop" and last.stopping_word == word
    assert "".join(e.text for e in events[0]) == whole[: whole.index(word)]


def test_leaving_the_iterator_cancels_the_sequence(engine):
    cancelled = engine.stats.cancelled_sequences

    async def first_event_only():
        async for _ in engine.submit([request(max_tokens=500)]):
            break

    asyncio.run(first_event_only())
    deadline = time.monotonic() + 60
    while engine.stats.cancelled_sequences == cancelled and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.stats.cancelled_sequences == cancelled + 1
    assert engine.stats.active_sequences == 0


def test_a_bad_request_fails_alone(engine):
    """A prompt token outside the vocabulary fails to start; a request beside it is unharmed."""

    async def both():
        bad = collect(engine, [request(prompt=(1, 10**6))])
        good = collect(engine, [request(max_tokens=8)])
        return await asyncio.gather(bad, good)

    bad, good = asyncio.run(both())
    assert bad[0][-1].error and bad[0][-1].finish_reason is None
    assert good[0][-1].finish_reason == "length" and len(token_ids(good[0])) == 8


def test_logprobs_and_echo_scores(engine):
    events = run(engine, [request(max_tokens=3, logprobs=2, prompt_logprobs=True)])[0]
    prompt_tokens = next(e.prompt_tokens for e in events if e.prompt_tokens is not None)
    assert [t.token_id for t in prompt_tokens] == list(PROMPT)
    assert prompt_tokens[0].logprob is None and all(t.logprob < 0 for t in prompt_tokens[1:])
    generated = [t for e in events for t in e.tokens]
    assert len(generated) == 3 and all(len(t.top) >= 1 for t in generated)


def test_logprobs_beside_greedy_rows_that_report_none(engine):
    """A step whose rows are all greedy and report no logprobs skips normalising the logits; a
    row that reports them gets the same log probabilities beside such rows as alone."""

    def reported(events):
        return [
            (t.token_id, t.logprob, [a.logprob for a in t.alternatives])
            for e in events
            for t in e.tokens
        ]

    alone = reported(run(engine, [request(max_tokens=4, logprobs=3)])[0])
    together = run(
        engine,
        [request(prompt=PROMPT[:5]), request(max_tokens=4, logprobs=3), request(max_tokens=6)],
    )
    beside = reported(together[1])
    assert [t for t, _, _ in beside] == [t for t, _, _ in alone]
    for (_, logprob, top), (_, alone_logprob, alone_top) in zip(beside, alone):
        assert logprob == pytest.approx(alone_logprob, abs=LOGPROB_TOLERANCE)
        assert top == pytest.approx(alone_top, abs=LOGPROB_TOLERANCE)
        assert logprob <= 0 and sum(math.exp(x) for x in top) <= 1 + 1e-4
    assert not together[0][-1].tokens  # the other rows report none


def test_a_switch_to_a_missing_model_rolls_back(tiny_model, tmp_path):
    engine = Engine(str(tiny_model)).start()
    try:
        assert engine.wait_ready(300)
        engine.switch(str(tmp_path / "missing"))
        with pytest.raises(EngineError):
            engine.check_ready()
        assert engine.wait_ready(300)
        assert engine.model_name == tiny_model.name
        assert "model folder not found" in engine.load_error
        assert len(token_ids(run(engine, [request(max_tokens=4)])[0])) == 4
    finally:
        engine.stop()


def test_keep_alive_sets_the_idle_unload_until_the_next_load(tiny_model):
    """Ollama's keep_alive: a time beyond any timer (the engine waits in bounded steps), then
    0, which unloads at once; the next load brings back the server's own setting."""
    engine = Engine(str(tiny_model), idle_unload_s=None).start()
    try:
        assert engine.wait_ready(300)
        engine.keep_alive(1e300)
        assert asyncio.run(collect(engine, [request(max_tokens=2)]))  # the engine lives on
        engine.keep_alive(0)
        deadline = time.monotonic() + 60
        while engine.state != "unloaded" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert engine.state == "unloaded" and engine.loaded is None
        asyncio.run(engine.ensure_loaded(timeout=60))
        assert engine.loaded is not None and engine.idle_unload_s is None
    finally:
        engine.stop()


def test_an_idle_model_is_unloaded_and_reloaded_on_demand(tiny_model):
    engine = Engine(str(tiny_model), idle_unload_s=0.3).start()
    try:
        assert engine.wait_ready(300)
        deadline = time.monotonic() + 60
        while engine.state != "unloaded" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert engine.state == "unloaded" and engine.loaded is None

        async def reloaded():
            # An idle unload this short may come again before the request reaches the model
            # (a loaded machine's pause): it is then refused, and asked again.
            for _ in range(5):
                await engine.ensure_loaded(timeout=60)
                try:
                    return await collect(engine, [request(max_tokens=4)])
                except EngineError:
                    continue
            raise AssertionError("never reloaded in time for the request")

        assert len(token_ids(asyncio.run(reloaded())[0])) == 4
        assert engine.loads >= 2
    finally:
        engine.stop()


def test_a_request_admitted_and_not_yet_submitted_keeps_its_model_from_an_idle_unload(
    tiny_model,
):
    """Between its admission and its submission (planning, a stream's response starting), a
    request holds its model: the idle unload waits for it, then comes once it is gone."""
    engine = Engine(str(tiny_model), idle_unload_s=0.5).start()
    try:
        reservation = engine.reserve([request(max_tokens=4)])  # admitted before the load ends
        assert engine.wait_ready(300)
        time.sleep(2.0)  # four idle unloads' worth
        assert engine.state == "ready" and engine.loaded is not None
        engine.release(reservation)
        deadline = time.monotonic() + 60
        while engine.state != "unloaded" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert engine.state == "unloaded" and engine.loads == 1
    finally:
        engine.stop()


def test_a_cached_prompt_joins_beside_a_stream_in_its_decode_pass(engine, monkeypatch):
    """A prompt the prefix cache holds but for its last token, arriving beside a stream, reads
    one cached token again so that its last rides in the decode pass (mixed_batch.py), not in a
    pass of its own: the same tokens as alone, and no copy of it taken for the cache again."""
    prompt = (1, *range(200, 260))
    alone = token_ids(run(engine, [request(prompt=prompt, max_tokens=6)])[0])
    mixed = engine.generator.mixed
    assert mixed is not None  # the tiny Llama's batches carry chunks
    copied = []
    start = engine.prefixes.copies.start
    monkeypatch.setattr(
        engine.prefixes.copies,
        "start",
        lambda uid, tokens: (copied.append(tokens), start(uid, tokens)),
    )

    async def beside_a_stream():
        stream = engine.submit([request(prompt=(1, 5, 6, 7), max_tokens=60)])
        await anext(stream)
        joins, before = mixed.joins_carried, len(copied)
        again = await collect(engine, [request(prompt=prompt, max_tokens=6)])
        await stream.aclose()
        return again[0], mixed.joins_carried - joins, copied[before:]

    events, joins, copies = asyncio.run(beside_a_stream())
    assert token_ids(events) == alone
    assert joins == 1 and copies == []
    assert events[-1].cached_tokens == len(prompt) - 2
