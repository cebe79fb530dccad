"""Prompt-lookup speculation as clients see it: on by default and said so by /props and
/v1/models, counted by /metrics, turned off per request by mlx_lm.server's `num_draft_tokens`
(bounded, a 400 otherwise), the greedy text the same either way, and llama.cpp's stream still
one token a chunk."""

from __future__ import annotations

import json
import re

import httpx
import openai
import pytest

# The tiny model repeats a token for a while: its greedy answer drafts from itself.
GREEDY = {"prompt": "Once upon a time", "temperature": 0, "max_tokens": 48, "ignore_eos": True}


def draft_counts(http: httpx.Client) -> tuple[float, float]:
    text = http.get("/metrics").text
    assert "mlxserve_draft_tokens_total" in text

    def total(name: str) -> float:
        return sum(map(float, re.findall(rf"^mlxserve_{name}_total{{[^}}]*}} (\S+)$", text, re.M)))

    return total("draft_tokens"), total("draft_tokens_accepted")


def test_props_and_models_say_drafting_is_on(http):
    props = http.get("/props").json()
    assert props["default_generation_settings"]["speculative"] is True
    assert props["default_generation_settings"]["params"]["speculative.n_max"] == 16
    (card,) = [m for m in http.get("/v1/models").json()["data"] if m.get("default")]
    assert card["speculative"] == {
        "type": "ngram",
        "num_draft_tokens": 16,
        "ngram_min": 2,
        "ngram_max": 4,
    }


def test_a_greedy_answer_drafts_and_is_the_text_without(client: openai.OpenAI, http):
    before = draft_counts(http)
    extra = {"ignore_eos": True}
    on = client.completions.create(
        model="m", prompt=GREEDY["prompt"], max_tokens=48, temperature=0, extra_body=extra
    )
    after = draft_counts(http)
    off = client.completions.create(
        model="m",
        prompt=GREEDY["prompt"],
        max_tokens=48,
        temperature=0,
        extra_body={**extra, "num_draft_tokens": 0},
    )
    assert on.choices[0].text == off.choices[0].text
    assert on.usage.completion_tokens == off.usage.completion_tokens == 48
    # whether the first drafts: the pass costs timed on this machine decide (the engine tests
    # draft for sure); the counters exist and count only what drafts
    assert after[0] >= after[1] and after >= before
    # num_draft_tokens 0 drafted nothing: the request's own counts (llama.cpp's timings; the
    # server's counters also count what other tests' requests on this server still finish)
    quiet = http.post("/completion", json={**GREEDY, "num_draft_tokens": 0}).json()
    assert "draft_n" not in quiet["timings"] and quiet["content"] == off.choices[0].text


@pytest.mark.parametrize("value", [-1, 33, "8", 1.5])
def test_num_draft_tokens_out_of_bounds_is_a_400_naming_it(http, value):
    response = http.post("/v1/completions", json={**GREEDY, "num_draft_tokens": value})
    assert response.status_code == 400
    assert "num_draft_tokens" in response.text


def test_llama_cpp_streams_one_token_a_chunk_while_drafting(http):
    body = {"prompt": "Once upon a time", "temperature": 0, "n_predict": 32, "ignore_eos": True}
    with http.stream("POST", "/completion", json={**body, "stream": True}) as response:
        chunks = [json.loads(line[6:]) for line in response.iter_lines() if line[:6] == "data: "]
    *pieces, last = chunks
    assert len(pieces) == 32 and all(len(c["tokens"]) == 1 for c in pieces)
    assert last["tokens_predicted"] == 32
