"""Prompt-lookup drafts verified inside the batch: greedy rows emit exactly the tokens they emit
without drafts, several a step; every other row beside them is as it was; `max_tokens`, stop
strings, logprobs and the prefix cache hold where a step's drafts run past them.

The tiny model repeats one token, then turns to another: its drafts are mostly kept and
refused at each turn, so both the kept and the rolled-back paths run in every test."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from mlxserve.engine import Engine, GenerationRequest, StopSpec
from mlxserve.engine.mlx_lm_compat import speculative_step
from mlxserve.sampling.grammars import Constraint
from mlxserve.sampling.params import SamplingParams
from mlxserve.settings import SpeculationSettings
from mlxserve.speculation.pass_costs import FlatPassCosts

from ..device_numerics import LOGPROB_TOLERANCE

GREEDY = SamplingParams(temperature=0.0)
PROMPTS = [
    (1, 926, 328, 34, 25, 29, 668),
    (1, 5, 6, 7, 8, 5, 6, 7, 8, 5, 6),
    (1, 15, 792, 207, 555, 945, 883),
    (1, 40, 41, 42, 43, 44, 45, 46),
]


@pytest.fixture(scope="module")
def engine(tiny_model):
    engine = Engine(str(tiny_model), speculation=SpeculationSettings(draft_tokens=4)).start()
    assert engine.wait_ready(300), engine.error
    # rows draft whenever a lookup finds tokens (on the tiny model, timing noise would decide)
    engine.generator.planner.costs = FlatPassCosts()
    yield engine
    engine.stop()


def request(prompt, max_tokens=30, sampling=GREEDY, **kwargs) -> GenerationRequest:
    stop = kwargs.pop("stop", StopSpec(ignore_eos=True))
    return GenerationRequest(
        prompt_ids=tuple(prompt),
        max_tokens=max_tokens,
        sampling=sampling,
        seed=0,
        stop=stop,
        **kwargs,
    )


async def collect(engine: Engine, requests) -> dict[int, list]:
    events: dict[int, list] = {}
    async for event in engine.submit(requests):
        events.setdefault(event.index, []).append(event)
    return events


def run_apart(engine: Engine, requests) -> list[list]:
    """Each request as a group of its own, all at once: rows of one batch."""

    async def together():
        return await asyncio.gather(*(collect(engine, [r]) for r in requests))

    return [events[0] for events in asyncio.run(together())]


def ids(events) -> list[int]:
    return [t for e in events for t in e.token_ids]


def record_steps(engine: Engine, monkeypatch) -> list[tuple[int, list[int]]]:
    """(row, its tokens) of each step the engine's decode batch runs from now on: which tokens
    one step emitted together, which the events (one a token) do not tell."""
    batch, steps = engine.generator.decode_batch, []
    step = batch.next

    def recorded():
        responses = step()
        rows: dict[int, list[int]] = {}
        for r in responses:
            rows.setdefault(r.uid, []).append(r.token)
        steps.extend(rows.items())
        return responses

    monkeypatch.setattr(batch, "next", recorded)
    return steps


def drafted(engine: Engine) -> tuple[int, int]:
    totals = engine.draft_totals
    return totals.drafted, totals.accepted


def test_rows_of_one_batch_draft_and_emit_mlx_lms_greedy_tokens(engine, reference):
    before = drafted(engine)
    results = run_apart(engine, [request(p) for p in PROMPTS])
    for prompt, events in zip(PROMPTS, results):
        assert ids(events) == reference(prompt, 30)
        assert events[-1].finish_reason == "length" and events[-1].completion_tokens == 30
    made, kept = (a - b for a, b in zip(drafted(engine), before))
    assert made > kept > 0  # drafts kept, and refused (rolled back) at each turn


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 6, 11])
def test_max_tokens_is_exact_where_drafts_run_past_it(engine, reference, max_tokens):
    (events,) = run_apart(engine, [request(PROMPTS[1], max_tokens=max_tokens)])
    assert ids(events) == reference(PROMPTS[1], max_tokens)
    assert events[-1].finish_reason == "length"
    assert events[-1].completion_tokens == max_tokens


def test_rows_that_sample_or_process_logits_beside_drafting_rows_are_as_without(engine):
    others = [
        request(PROMPTS[0], sampling=SamplingParams(temperature=0.9), num_draft_tokens=0),
        request(PROMPTS[2], sampling=SamplingParams(temperature=0.0, repetition_penalty=1.3)),
    ]
    drafting = [request(PROMPTS[1]), request(PROMPTS[3])]
    alone = run_apart(engine, others)
    beside = run_apart(engine, [*others, *drafting])
    assert [ids(e) for e in beside[:2]] == [ids(e) for e in alone]


def two_sample_chi_square(a: list[int], b: list[int]) -> tuple[float, int]:
    """The statistic and degrees of freedom of two equal-sized samples of tokens coming from one
    distribution; tokens seen under 10 times in both together are pooled."""
    counts = {t: (a.count(t), b.count(t)) for t in set(a) | set(b)}
    big = {t: c for t, c in counts.items() if sum(c) >= 10}
    rest = [sum(c[i] for t, c in counts.items() if t not in big) for i in (0, 1)]
    cells = [*big.values(), *([tuple(rest)] if sum(rest) else [])]
    return sum((x - y) ** 2 / (x + y) for x, y in cells), len(cells) - 1


def chi_square_critical(dof: int, z: float = 3.719) -> float:
    """Chi-square's upper quantile at alpha 1e-4 (z), by Wilson and Hilferty's approximation."""
    return dof * (1 - 2 / (9 * dof) + z * (2 / (9 * dof)) ** 0.5) ** 3


def test_sampled_rows_draft_and_keep_the_models_distribution(engine, monkeypatch):
    """Speculative sampling: drafts kept with the model's probability, the residual drawn at a
    refusal (never the refused draft); each position's tokens over 300 seeds are distributed as
    without drafts."""
    refusals, redrawn = [], []
    verify = speculative_step.verify_step

    def watched(batch, planner, drafts, processed):
        emitted, logprobs = verify(batch, planner, drafts, processed)
        following = batch._next_tokens.tolist()
        for draft, tokens, token in zip(drafts, emitted, following):
            if len(tokens) - 1 < len(draft):  # a draft refused: the token drawn in its place
                refusals.append(token)
                if token == draft[len(tokens) - 1]:
                    redrawn.append(token)
        return emitted, logprobs

    monkeypatch.setattr(speculative_step, "verify_step", watched)
    # a few likely tokens at each position; the prompt's end drafts the less likely ones too
    sampling = SamplingParams(temperature=0.5, top_k=3)
    prompt = (*PROMPTS[1], 411, 177, 411, 177, 411, 177, 411)

    def tokens_by_position(**kwargs) -> list[list[int]]:
        out = []
        for seeds in range(0, 300, 30):  # groups of 30: after their prefill, steps draft
            group = [
                GenerationRequest(
                    prompt, 5, sampling, seed=s, stop=StopSpec(ignore_eos=True), **kwargs
                )
                for s in range(seeds, seeds + 30)
            ]
            events = asyncio.run(collect(engine, group))
            out += [ids(events[i]) for i in range(len(group))]
        return out

    before = drafted(engine)
    with_drafts = tokens_by_position(num_draft_tokens=4)  # sampled rows draft when asked
    made, kept = (a - b for a, b in zip(drafted(engine), before))
    without = tokens_by_position(num_draft_tokens=0)
    assert made > kept > 0
    assert len(refusals) > 20 and not redrawn
    for position in range(1, 5):
        statistic, dof = two_sample_chi_square(
            [t[position] for t in with_drafts], [t[position] for t in without]
        )
        assert dof >= 1 and statistic < chi_square_critical(dof), (position, statistic, dof)


def test_a_request_with_num_draft_tokens_0_drafts_nothing(engine, reference):
    before = drafted(engine)
    (events,) = run_apart(engine, [request(PROMPTS[1], num_draft_tokens=0)])
    assert ids(events) == reference(PROMPTS[1], 30)
    assert drafted(engine) == before


def test_logprobs_of_drafted_tokens_are_the_targets(engine):
    on, off = run_apart(
        engine,
        [request(PROMPTS[0], logprobs=3), request(PROMPTS[0], logprobs=3, num_draft_tokens=0)],
    )
    assert ids(on) == ids(off)
    with_drafts = [t for e in on for t in e.tokens]
    without = [t for e in off for t in e.tokens]
    assert len(with_drafts) == len(without) == 30
    for a, b in zip(with_drafts, without):
        assert a.logprob == pytest.approx(b.logprob, abs=LOGPROB_TOLERANCE)
        assert [x.token_id for x in a.alternatives] == [x.token_id for x in b.alternatives]


def test_the_kv_a_drafting_row_leaves_in_the_prefix_cache_continues_exactly(engine, reference):
    # 11 tokens: the row's last step keeps drafts past its end, which leave its KV
    (first,) = run_apart(engine, [request(PROMPTS[2], max_tokens=11)])
    longer = PROMPTS[2] + tuple(ids(first))
    (second,) = run_apart(engine, [request(longer, max_tokens=12)])
    assert second[-1].cached_tokens >= len(PROMPTS[2])
    assert ids(second) == reference(longer, 12)


def grammar_request(engine: Engine, kind: str, text: str, **kwargs) -> GenerationRequest:
    grammar = engine.loaded.grammars.compile(Constraint("test", kind, text))
    return request(PROMPTS[0], sampling=replace(GREEDY, grammar=grammar), stop=StopSpec(), **kwargs)


def one_key_schema(key: str) -> str:
    """An object with one required integer property `key`: its name is forced, token by token."""
    return (
        f'{{"type": "object", "properties": {{"{key}": {{"type": "integer"}}}}, '
        f'"required": ["{key}"], "additionalProperties": false}}'
    )


def test_a_grammar_row_drafts_what_its_grammar_allows(engine):
    """The tiny model would write 1s on and on; the regex makes it turn to x after six. A
    grammar row's drafts are cut where the grammar refuses them and each drafted position is
    masked as the grammar masks it: the text is the one without drafts."""
    constrained = grammar_request(engine, "regex", "(1{6}x{6})+", max_tokens=24)
    (alone,) = run_apart(engine, [replace(constrained, num_draft_tokens=0)])
    assert "".join(e.text for e in alone).startswith("111111x")
    beside = run_apart(engine, [constrained, request(PROMPTS[1]), request(PROMPTS[3])])
    assert ids(beside[0]) == ids(alone)
    assert beside[0][-1].timings.draft_tokens > 0


def test_tokens_a_grammar_forces_are_drafted_and_emitted_together(engine, monkeypatch):
    """llguidance's fast-forward tokens: a JSON schema with one long required key forces the
    key's tokens, which go through the pass as drafts (all kept), several in one step."""
    key = "the_only_property_this_object_may_have"
    constrained = grammar_request(engine, "json_schema", one_key_schema(key), max_tokens=30)
    (alone,) = run_apart(engine, [replace(constrained, num_draft_tokens=0)])
    assert "".join(e.text for e in alone).startswith(f'{{"{key}":')
    steps = record_steps(engine, monkeypatch)
    beside = run_apart(engine, [constrained, request(PROMPTS[1])])
    assert ids(beside[0]) == ids(alone)
    timings = beside[0][-1].timings
    assert timings.draft_accepted == timings.draft_tokens > 0
    by_row: dict[int, list[list[int]]] = {}
    for uid, tokens in steps:
        by_row.setdefault(uid, []).append(tokens)
    (its_steps,) = [s for s in by_row.values() if sum(s, []) == ids(alone)]
    assert max(map(len, its_steps)) > 2


def test_tokens_a_grammar_forces_ride_even_where_no_lookup_finds_drafts(engine, monkeypatch):
    """A grammar row alone, whose own tokens give the lookup nothing: the tokens its grammar
    forces (a long required key) still go through one pass together, all kept, where plain
    steps would take them one a step; the text is the one without drafts."""
    key = "a_long_required_property_name_nobody_repeats"
    constrained = grammar_request(engine, "json_schema", one_key_schema(key), max_tokens=20)
    (alone,) = run_apart(engine, [replace(constrained, num_draft_tokens=0)])
    steps = record_steps(engine, monkeypatch)
    planner, verdicts = engine.generator.planner, []
    record = planner.record

    def recorded(uids, drafts, kept, forced=None):
        verdicts.append((drafts[0], kept[0], forced and forced[0]))
        record(uids, drafts, kept, forced)

    monkeypatch.setattr(planner, "record", recorded)
    (drafting,) = run_apart(engine, [constrained])
    assert ids(drafting) == ids(alone)
    timings = drafting[-1].timings
    assert timings.draft_accepted == timings.draft_tokens > 0
    assert max(len(tokens) for _, tokens in steps) > 2
    # the row's acceptance is its own drafts': the forced ones are told apart
    assert any(drafts and forced == len(drafts) == kept for drafts, kept, forced in verdicts)
