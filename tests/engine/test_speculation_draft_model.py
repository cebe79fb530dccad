"""A draft model's drafts verified inside the batch (`--draft-model`): greedy rows emit exactly
mlx-lm's tokens, rows that join and leave the batch at different steps keep their own draft KV,
and a draft model with another tokenizer is refused at load, saying why.

The draft is the tiny model cut to its first layer (scripts/make_draft_model.py): it agrees
with the model often but not always, so kept and refused drafts (rolled back in both models'
KV) run in every test; the model as its own draft agrees always."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from mlxserve.engine import Engine
from mlxserve.engine.prefix.disk import BLOCK, MIN_TOKENS
from mlxserve.engine.prefix.keeper import PrefixKeeper
from mlxserve.engine.stats import EngineStats
from mlxserve.settings import SpeculationSettings
from mlxserve.speculation.draft_model import ModelDrafter
from mlxserve.speculation.pass_costs import FlatPassCosts

from .test_speculation_engine import (
    PROMPTS,
    drafted,
    grammar_request,
    ids,
    one_key_schema,
    record_steps,
    request,
    run_apart,
)

DISK_PROMPT_TOKENS = MIN_TOKENS + 76  # past the shortest prompt written to disk

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from make_draft_model import truncate  # noqa: E402


def drafting_engine(model: Path, draft: Path) -> Engine:
    settings = SpeculationSettings(draft_tokens=4, draft_model=str(draft))
    engine = Engine(str(model), speculation=settings).start()
    assert engine.wait_ready(300), engine.error
    engine.generator.planner.costs = FlatPassCosts()
    return engine


@pytest.fixture(scope="module")
def one_layer_draft(tiny_model, tmp_path_factory) -> Path:
    return truncate(tiny_model, tmp_path_factory.mktemp("draft") / "tiny-1-layer", layers=1)


@pytest.fixture(scope="module")
def engine(tiny_model, one_layer_draft):
    engine = drafting_engine(tiny_model, one_layer_draft)
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def self_drafting(tiny_model):
    """The model as its own draft: a draft KV that holds what the model's holds drafts what
    the model emits, so every draft is kept; one out of step is refused."""
    engine = drafting_engine(tiny_model, tiny_model)
    yield engine
    engine.stop()


def test_rows_joining_and_leaving_draft_and_emit_mlx_lms_greedy_tokens(engine, reference):
    """Four rows of different lengths in one batch: each leaves at its own step, the others'
    draft KV rows stay theirs."""
    before = drafted(engine)
    lengths = [30, 24, 17, 9]
    results = run_apart(engine, [request(p, max_tokens=n) for p, n in zip(PROMPTS, lengths)])
    for prompt, n, events in zip(PROMPTS, lengths, results):
        assert ids(events) == reference(prompt, n)
        assert events[-1].finish_reason == "length" and events[-1].completion_tokens == n
    made, kept = (a - b for a, b in zip(drafted(engine), before))
    assert made > kept > 0  # the one-layer draft is refused at times: both KVs rolled back
    timings = [events[-1].timings for events in results]  # each request's own counts
    assert sum(t.draft_tokens for t in timings) == made
    assert sum(t.draft_accepted for t in timings) == kept


def test_a_row_after_plain_steps_catches_its_draft_kv_up(self_drafting, reference, monkeypatch):
    """Steps that draft nothing (here: every other one) leave the draft KV behind; the next
    drafting step feeds it what it missed, and its drafts are all kept again."""
    engine = self_drafting
    before = drafted(engine)
    planner = engine.generator.planner
    width = planner.width
    calls = []

    def every_other(*args):
        calls.append(None)
        return width(*args) if len(calls) % 2 else 0

    monkeypatch.setattr(planner, "width", every_other)
    steps = record_steps(engine, monkeypatch)
    (events,) = run_apart(engine, [request(PROMPTS[1], max_tokens=25)])
    assert ids(events) == reference(PROMPTS[1], 25)
    assert any(len(tokens) > 1 for _, tokens in steps)
    assert any(len(tokens) == 1 for _, tokens in steps)
    made, kept = (a - b for a, b in zip(drafted(engine), before))
    assert made == kept > 0


@pytest.mark.parametrize("max_tokens", [1, 2, 5])
def test_max_tokens_is_exact_with_a_draft_model(engine, reference, max_tokens):
    (events,) = run_apart(engine, [request(PROMPTS[3], max_tokens=max_tokens)])
    assert ids(events) == reference(PROMPTS[3], max_tokens)
    assert events[-1].completion_tokens == max_tokens


def test_the_model_as_its_own_draft_has_every_draft_kept(self_drafting, reference):
    """Rows that join and leave at different steps: each draft KV row stays its own."""
    before = drafted(self_drafting)
    lengths = [30, 24, 17, 9]
    results = run_apart(self_drafting, [request(p, max_tokens=n) for p, n in zip(PROMPTS, lengths)])
    assert [ids(e) for e in results] == [reference(p, n) for p, n in zip(PROMPTS, lengths)]
    made, kept = (a - b for a, b in zip(drafted(self_drafting), before))
    assert made == kept > 0


def greedy_agreement(model: Path, draft: Path, text: str) -> float:
    """The share of `text`'s positions where the draft's greedy next token is the model's."""
    import mlx.core as mx
    import mlx_lm

    target, tokenizer = mlx_lm.load(str(model))
    drafter, _ = mlx_lm.load(str(draft))
    tokens = mx.array(tokenizer.encode(text)[:256])[None]
    agreed = mx.argmax(target(tokens), axis=-1) == mx.argmax(drafter(tokens), axis=-1)
    return agreed.astype(mx.float32).mean().item()


@pytest.fixture
def float_or_4bit(request) -> Path:
    """The tiny model as its parameter names it (a fixture): float, or quantized."""
    return request.getfixturevalue(request.param)


@pytest.mark.parametrize("float_or_4bit", ["tiny_model", "tiny_model_4bit"], indirect=True)
def test_a_fitted_head_drafts_the_models_tokens_more_often_and_exactly(float_or_4bit, tmp_path):
    """make_draft_model.py --fit-head: on text it was not fitted on (this file), the cut
    model's greedy token is the model's more often through the fitted head than through the
    model's own; an engine drafting with it (its head untied; quantized as the model's
    embedding is) emits the tokens it emits without drafts."""
    model = float_or_4bit
    plain = truncate(model, tmp_path / "plain", layers=1)
    fitted = truncate(model, tmp_path / "fitted", layers=1, fit_head=True)
    text = Path(__file__).read_text()
    own, fit = (greedy_agreement(model, d, text) for d in (plain, fitted))
    assert fit > own, (fit, own)
    engine = drafting_engine(model, fitted)
    try:
        before = drafted(engine)
        asked = [request(p, max_tokens=n) for p, n in zip(PROMPTS, (30, 17))]
        plain = [request(p, max_tokens=n, num_draft_tokens=0) for p, n in zip(PROMPTS, (30, 17))]
        results = run_apart(engine, [*asked, *plain])
        assert [ids(e) for e in results[:2]] == [ids(e) for e in results[2:]]
        made, kept = (a - b for a, b in zip(drafted(engine), before))
        assert made >= kept > 0
    finally:
        engine.stop()


def test_a_draft_model_with_another_tokenizer_is_refused_at_load(tiny_model, tiny_coder):
    settings = SpeculationSettings(draft_tokens=4, draft_model=str(tiny_coder))
    engine = Engine(str(tiny_model), speculation=settings).start()
    try:
        assert not engine.wait_ready(300)
        assert f"--draft-model {tiny_coder}" in engine.error
        assert "must share the model's tokenizer" in engine.error
    finally:
        engine.stop()


def test_the_draft_kv_holds_each_rows_kept_tokens_through_joins_refusals_and_catch_ups(
    tiny_lm, reference
):
    """The drafter alone, driven as the planner drives it: after each verdict (some drafts
    kept, then a token of the target's own), plain steps missed by some rows, a row leaving
    and one joining, each row's drafts are the model's greedy tokens after its sequence."""
    drafter = ModelDrafter(tiny_lm)
    sequences = {0: list(PROMPTS[0]), 1: list(PROMPTS[1]), 2: list(PROMPTS[2])}

    def drafts_are_greedy(width: int) -> dict[int, list[int]]:
        uids = list(sequences)
        found = drafter.drafts(uids, [sequences[u] for u in uids], width)
        assert found == {u: reference(sequences[u], width) for u in uids}
        return found

    found = drafts_are_greedy(4)
    kept = {0: 0, 1: 2, 2: 4}
    drafter.record(kept, found)
    for uid, count in kept.items():
        sequences[uid] += found[uid][:count] + [700 + uid]  # the target's own token after them
    sequences[1] += [5, 6, 7]  # plain steps the drafter did not see
    found = drafts_are_greedy(3)
    drafter.record({0: 3, 1: 1}, found)
    sequences[0] += found[0] + [11]
    sequences[1] += found[1][:1] + [12]
    sequences[2] += [13]
    del sequences[2]  # the row leaves the batch
    sequences[3] = list(PROMPTS[3])  # and another joins it
    drafts_are_greedy(5)


def test_the_draft_kv_keeps_only_its_own_drafts_the_target_kept_or_none_unverified(
    tiny_lm, reference
):
    """A grammar's drafts are not always the model's: it cuts them (the tokens it allows) or
    replaces them (the tokens it forces), and a step whose drafts it refuses all verifies
    none. The draft KV then keeps only the model's own drafts the target kept; each row's next
    drafts are still the model's greedy tokens after its sequence."""
    drafter = ModelDrafter(tiny_lm)
    sequences = {0: list(PROMPTS[0]), 1: list(PROMPTS[1])}

    def drafts_are_greedy(width: int) -> dict[int, list[int]]:
        found = drafter.drafts(list(sequences), list(sequences.values()), width)
        assert found == {u: reference(sequences[u], width) for u in sequences}
        return found

    found = drafts_are_greedy(4)
    forced = [found[0][0], found[0][1] + 1, 5]  # the second is not the model's own
    before = [len(sequences[0]), len(sequences[1])]
    drafter.record({0: 3, 1: 2}, {0: forced, 1: found[1][:2]})
    assert drafter.fed == [before[0] + 1, before[1] + 2]  # its KV: its own drafts, kept
    sequences[0] += forced + [21]
    sequences[1] += found[1][:2] + [22]
    drafts_are_greedy(4)
    before = [len(sequences[0]), len(sequences[1])]
    drafter.record({}, {})  # refused by the grammar: no verify pass
    assert drafter.fed == before
    sequences[0] += [23]  # a plain step
    sequences[1] += [24]
    found = drafts_are_greedy(3)
    before = [len(sequences[0]), len(sequences[1])]
    drafter.record({0: 6}, {0: found[0] + [7, 8, 9]})  # forced tokens past its own, all kept
    assert drafter.fed == [before[0] + 2, before[1]]  # a pass's KV holds width - 1 drafts


def test_grammar_rows_draft_from_a_draft_model_and_write_as_without(engine):
    """A regex that turns the tiny model from its 1s after six (its drafts refused there, the
    step plain), and a schema whose long key the grammar forces (its tokens verified in place
    of the model's drafts), each alone and beside another row: each text is the one without
    drafts. The forced tokens, all kept, do not count as the pair agreeing (a new row's prior
    is how often the draft model's own drafts were kept)."""
    key = "the_only_property_this_object_may_have"
    pair = engine.generator.planner.model
    for kind, text in (("regex", "(1{6}x{6})+"), ("json_schema", one_key_schema(key))):
        constrained = grammar_request(engine, kind, text, max_tokens=24)
        (plain,) = run_apart(engine, [replace(constrained, num_draft_tokens=0)])
        agreed = pair.agreed
        (alone,) = run_apart(engine, [constrained])
        if kind == "json_schema":
            assert pair.agreed - agreed < alone[-1].timings.draft_accepted
        beside = run_apart(engine, [constrained, request(PROMPTS[1])])
        for drafting in (alone, beside[0]):
            assert ids(drafting) == ids(plain), kind
            assert drafting[-1].timings.draft_tokens > 0, kind


def test_a_joining_row_reads_only_what_the_draft_prefix_cache_lacks(tiny_lm, reference):
    """Rows' draft KV is kept as they join (their prompt) and as they leave (every token their
    draft KV holds, kept drafts too): a later row whose sequence starts with either reads only
    the rest, and still drafts the model's greedy tokens."""
    keeper = PrefixKeeper(64 << 20, EngineStats())
    drafter = ModelDrafter(tiny_lm, keeper)
    prefixes = keeper.cache
    first = list(PROMPTS[0]) + [3]  # a prompt, and the step's first token
    found = drafter.drafts([0], [first], 4)
    drafter.record({0: 2}, found)
    drafter.forget([0])  # leaves holding its sequence and the two drafts kept
    held = first + found[0][:2]
    later = held + [9, 10]
    before = prefixes.reused_tokens
    found = drafter.drafts([1], [later], 3)
    assert found == {1: reference(later, 3)}
    assert prefixes.reused_tokens - before == len(held)

    drafter.record({1: 1}, found)
    later += found[1][:1] + [14]
    twin = list(PROMPTS[0]) + [4]  # the first row's prompt, another token after it
    before = prefixes.reused_tokens
    assert drafter.drafts([1, 2], [later, twin], 3) == {
        1: reference(later, 3),
        2: reference(twin, 3),
    }
    assert prefixes.reused_tokens - before == len(PROMPTS[0])


def test_a_repeated_prompt_drafts_from_the_draft_kv_its_first_run_left(engine, reference):
    prompt = PROMPTS[2]
    cache = engine.prefixes.draft.cache
    (first,) = run_apart(engine, [request(prompt, max_tokens=12)])
    before = cache.reused_tokens
    (again,) = run_apart(engine, [request(prompt, max_tokens=12)])
    assert ids(first) == ids(again) == reference(prompt, 12)
    assert cache.reused_tokens - before >= len(prompt)


def test_a_restarted_engine_drafts_from_the_draft_kv_a_stopped_one_wrote(
    tiny_model, one_layer_draft, reference, tmp_path
):
    """With a folder for the prefix cache, a long prompt's draft KV is written there beside the
    model's (files of its own), and a restarted engine's draft model starts the same prompt
    from them, still drafting what the model emits greedily."""
    prompt = [3 + i * 7919 % 1000 for i in range(DISK_PROMPT_TOKENS)]
    settings = SpeculationSettings(draft_tokens=4, draft_model=str(one_layer_draft))
    runs = []
    for _ in range(2):
        engine = Engine(str(tiny_model), speculation=settings, prefix_cache_dir=tmp_path).start()
        try:
            assert engine.wait_ready(300), engine.error
            engine.generator.planner.costs = FlatPassCosts()
            (events,) = run_apart(engine, [request(prompt, max_tokens=12)])
            draft = engine.prefixes.draft
            runs.append((ids(events), draft.disk.loaded, draft.cache.reused_tokens))
        finally:
            engine.stop()
        # the model's segments and the draft's, each under its own fingerprint's prefix
        assert len({path.name[:16] for path in tmp_path.glob("*.safetensors")}) == 2
    (first, first_loads, _), (again, loads, reused) = runs
    assert first == again == reference(prompt, 12)
    assert first_loads == 0 and loads == 1 and reused >= DISK_PROMPT_TOKENS - BLOCK
