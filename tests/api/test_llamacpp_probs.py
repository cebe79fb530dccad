"""llama.cpp's /completion token details on a real server: every streamed chunk carries its
token ids, `n_probs` entries with ids (after the sampler chain with `post_sampling_probs`), and
in a stream each token's probabilities come with it."""

from __future__ import annotations

import json
import math

import httpx
import pytest

from ..device_numerics import LOGPROB_TOLERANCE

GREEDY = {"prompt": "Once upon a time", "temperature": 0, "n_predict": 8, "ignore_eos": True}


def llama_stream(http: httpx.Client, **body) -> list[dict]:
    with http.stream("POST", "/completion", json={**body, "stream": True}) as response:
        assert response.status_code == 200, response.read()
        return [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]


def test_each_streamed_chunk_carries_its_token_ids(http):
    answer = http.post("/completion", json={**GREEDY, "return_tokens": True}).json()
    assert len(answer["tokens"]) == 8
    assert http.post("/completion", json=GREEDY).json()["tokens"] == []  # not asked for
    chunks = llama_stream(http, **GREEDY)
    *pieces, last = chunks
    assert all(len(c["tokens"]) == 1 and c["stop"] is False for c in pieces)
    assert [t for c in pieces for t in c["tokens"]] == answer["tokens"]
    assert "".join(c["content"] for c in pieces) == answer["content"]
    assert last["stop"] is True and last["tokens"] == [] and last["content"] == ""


def test_n_probs_entries_name_their_tokens_by_id(http):
    body = {**GREEDY, "n_probs": 10, "return_tokens": True}
    answer = http.post("/completion", json=body).json()
    probs = answer["completion_probabilities"]
    assert [p["id"] for p in probs] == answer["tokens"]
    for entry in probs:
        top = entry["top_logprobs"]
        assert len(top) == 10
        assert {"id", "token", "bytes", "logprob"} <= set(top[0])
        assert top[0]["id"] == entry["id"]  # greedy: the most likely one was taken
        assert top[0]["logprob"] == entry["logprob"]
        values = [t["logprob"] for t in top]
        assert values == sorted(values, reverse=True)
        assert entry["bytes"] == list(entry["token"].encode())
    assert "completion_probabilities" not in http.post("/completion", json=GREEDY).json()
    zero = http.post("/completion", json={**GREEDY, "n_probs": 0}).json()
    assert "completion_probabilities" not in zero  # llama.cpp: n_probs 0 is none


def test_a_stream_sends_each_tokens_probabilities_with_it(http):
    answer = http.post("/completion", json={**GREEDY, "n_probs": 3}).json()
    *pieces, last = llama_stream(http, **GREEDY, n_probs=3)
    streamed = [p for c in pieces for p in c["completion_probabilities"]]
    assert all(len(c["completion_probabilities"]) == 1 for c in pieces)
    assert [p["id"] for p in streamed] == [c["tokens"][0] for c in pieces]
    assert_same_probabilities(streamed, answer["completion_probabilities"])
    assert "completion_probabilities" not in last


def assert_same_probabilities(ours: list[dict], theirs: list[dict]) -> None:
    """The same tokens and alternatives, logprobs within LOGPROB_TOLERANCE: the two requests
    may verify drafts in passes of different widths, which moves a logprob in its last
    digits (measured: 5e-7 on the CPU)."""

    def shape(entries):
        return [
            (e["id"], e["token"], e["bytes"], [(t["id"], t["token"]) for t in e["top_logprobs"]])
            for e in entries
        ]

    def numbers(entries):
        return [[e["logprob"], *(t["logprob"] for t in e["top_logprobs"])] for e in entries]

    assert shape(ours) == shape(theirs)
    for a, b in zip(numbers(ours), numbers(theirs)):
        assert a == pytest.approx(b, abs=LOGPROB_TOLERANCE)


def test_post_sampling_probs_are_those_the_token_was_drawn_from(http):
    greedy = http.post(
        "/completion", json={**GREEDY, "n_probs": 5, "post_sampling_probs": True}
    ).json()
    for entry in greedy["completion_probabilities"]:
        # Temperature 0 keeps one candidate: the chosen token, certain.
        assert entry["prob"] == 1.0 and "logprob" not in entry
        assert entry["top_probs"] == [{k: entry[k] for k in ("id", "token", "bytes", "prob")}]
    body = {
        "prompt": "Once upon a time",
        "n_predict": 12,
        "ignore_eos": True,
        "temperature": 1.5,
        "top_k": 3,
        "min_p": 0,
        "top_p": 1,
        "seed": 5,
        "n_probs": 10,
        "post_sampling_probs": True,
    }
    for answer in (
        http.post("/completion", json=body).json(),
        {
            "completion_probabilities": [
                p for c in llama_stream(http, **body)[:-1] for p in c["completion_probabilities"]
            ]
        },
    ):
        entries = answer["completion_probabilities"]
        assert len(entries) == 12
        for entry in entries:
            top = entry["top_probs"]
            assert 1 <= len(top) <= 3  # top_k kept three at most
            assert math.isclose(sum(t["prob"] for t in top), 1.0, rel_tol=1e-4)
            # The drawn token is one the chain kept, with its probability there.
            kept = {t["id"]: t["prob"] for t in top}
            assert entry["id"] in kept and math.isclose(kept[entry["id"]], entry["prob"])


def test_n_probs_of_ten_passes_on_llamacpp_routes_not_openais(http):
    assert http.post("/completion", json={**GREEDY, "n_probs": 10}).status_code == 200
    refused = http.post("/v1/completions", json={"prompt": "x", "max_tokens": 1, "logprobs": 10})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "logprobs"
