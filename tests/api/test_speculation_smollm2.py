"""Prompt lookup on a real model copying a real file (SmolLM2, from ../shared/models): the text
with drafts equals the text without, a stop string inside a step's kept drafts ends it where it
ends without them, and a stop token with drafts kept after it leaves the prefix cache a KV that
continues exactly. In the every-tier pass only (the engine tier's module runs on the tiny
model, in test-fast and both passes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlxserve.engine import StopSpec
from mlxserve.speculation import ngram
from mlxserve.speculation.pass_costs import FlatPassCosts

from ..conftest import SMOLLM2, SMOLLM2_ID, shared_model
from ..engine.test_speculation_engine import (
    drafted,
    ids,
    record_steps,
    request,
    run_apart,
)


@pytest.mark.slow
@pytest.mark.parametrize("model", [pytest.param(SMOLLM2, id=SMOLLM2_ID)])  # its worker's
def test_a_code_edit_on_smollm2_drafts_and_its_text_is_as_without(
    smollm2_engine, monkeypatch, model
):
    """A real model copying a real file: drafts are kept, the text equals the text without,
    and a stop string inside a step's kept drafts ends it where it ends without them."""
    tokenizer = smollm2_engine.loaded.tokenizer
    shared_model(model)
    # the engine is shared: the costs other tests' steps timed (beside whatever else ran)
    # must not decide whether these rows draft
    monkeypatch.setattr(smollm2_engine.generator.planner, "costs", FlatPassCosts())
    text = Path(ngram.__file__).read_text()[:480]
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": f"Repeat this code exactly.\n\n```python\n{text}```"}],
        add_generation_prompt=True,
    )
    stop = StopSpec()
    before = drafted(smollm2_engine)
    on, off = run_apart(
        smollm2_engine,
        [request(prompt, 40, stop=stop), request(prompt, 40, stop=stop, num_draft_tokens=0)],
    )
    assert ids(on) == ids(off)
    made, kept = (a - b for a, b in zip(drafted(smollm2_engine), before))
    assert made > 0 and kept > 0  # (other tests' rows may draft beside these)
    answer = "".join(e.text for e in off)
    ending = answer[len(answer) * 2 // 3 :][:12]
    stop = StopSpec(strings=(ending,))
    on, off = run_apart(
        smollm2_engine,
        [request(prompt, 40, stop=stop), request(prompt, 40, stop=stop, num_draft_tokens=0)],
    )
    assert "".join(e.text for e in on) == "".join(e.text for e in off)
    assert on[-1].finish_reason == off[-1].finish_reason == "stop"

    # A stop token read with drafts kept after it in its step: they leave the row's KV before
    # the prefix cache keeps it, so a prompt continuing the text starts from it exactly. (Only
    # that row's KV is kept: no other entry may match the continuation further.)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": f"Copy this code exactly.\n\n```python\n{text}```"}],
        add_generation_prompt=True,
    )
    steps = record_steps(smollm2_engine, monkeypatch)
    (scout,) = run_apart(smollm2_engine, [request(prompt, 16, stop=StopSpec(), cache_prompt=False)])
    out = ids(scout)
    (uid,) = {uid for uid, tokens in steps if tokens == out[: len(tokens)]}
    seen: list[int] = []
    stop_id = None
    for row, tokens in steps:  # the first token new to the answer with kept drafts after it
        if row == uid:
            if stop_id is None and len(tokens) > 1 and tokens[0] not in seen:
                stop_id = tokens[0]
            seen += tokens
    assert stop_id is not None, "no step kept drafts"
    stop = StopSpec(token_ids=(stop_id,))
    on, off = run_apart(
        smollm2_engine,
        [
            request(prompt, 16, stop=stop),
            request(prompt, 16, stop=stop, num_draft_tokens=0, cache_prompt=False),
        ],
    )
    assert ids(on) == ids(off) and on[-1].finish_reason == "stop"
    longer = [*prompt, *ids(on), stop_id, *tokenizer.encode("\n\n# Now")]
    cached, fresh = run_apart(
        smollm2_engine,
        [
            request(longer, 8, num_draft_tokens=0, logprobs=0),
            request(longer, 8, cache_prompt=False, logprobs=0),
        ],
    )
    assert cached[-1].cached_tokens == len(ids(on)) + len(prompt) + 1
    assert ids(cached) == ids(fresh)
    scored = [[t.logprob for e in run for t in e.tokens] for run in (cached, fresh)]
    assert scored[0] == pytest.approx(scored[1], abs=1e-3)
