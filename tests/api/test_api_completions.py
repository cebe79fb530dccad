"""POST /v1/completions: response shape, prompt forms, n / best_of, echo, logprobs, max_tokens."""

from __future__ import annotations

import math

import pytest

from ..helpers import complete, texts

PROMPT = "def add(a, b):\n    return"
# 1,900 of the tiny model's 2,048 positions: "until the context is full" is 148 tokens away.
NEAR_FULL_IDS = [1] + [401] * 1899


def test_openai_client_gets_openai_shape(client, tokenizer):
    # A prompt no other test sends: whatever ran before on this server, it is not cached whole.
    prompt = "def openai_shape_check(a, b):\n    return"
    result = client.completions.create(
        model="tiny", prompt=prompt, max_tokens=5, extra_body={"ignore_eos": True}
    )
    assert result.id.startswith("cmpl-")
    assert result.object == "text_completion"
    assert result.model == "tiny"
    assert result.system_fingerprint
    assert len(result.choices) == 1
    choice = result.choices[0]
    assert choice.index == 0 and choice.finish_reason == "length" and choice.text
    prompt_tokens = len(tokenizer.encode(prompt))
    assert result.usage.prompt_tokens == prompt_tokens
    assert result.usage.completion_tokens == 5
    assert result.usage.total_tokens == prompt_tokens + 5
    # Earlier requests on this session's server may have left a shared prefix (BOS) cached.
    assert 0 <= result.usage.prompt_tokens_details.cached_tokens < prompt_tokens


def test_default_max_tokens_is_16(http):
    result = complete(http, prompt=PROMPT, ignore_eos=True)
    assert result["usage"]["completion_tokens"] == 16


@pytest.mark.parametrize("until_full", [-1, None])
def test_max_tokens_minus_one_or_null_runs_to_the_end_of_the_context(http, until_full):
    result = complete(
        http, prompt=NEAR_FULL_IDS, max_tokens=until_full, ignore_eos=True, temperature=0
    )
    usage = result["usage"]
    assert usage["total_tokens"] == 2048  # the tiny model's context window
    assert usage["completion_tokens"] == 2048 - len(NEAR_FULL_IDS)
    assert result["choices"][0]["finish_reason"] == "length"


def test_n_predict_is_llamacpp_for_max_tokens(http):
    result = complete(http, prompt=PROMPT, n_predict=7, ignore_eos=True)
    assert result["usage"]["completion_tokens"] == 7


def test_token_id_prompt_equals_its_string(http, tokenizer):
    ids = tokenizer.encode(PROMPT)
    by_text = complete(http, prompt=PROMPT, max_tokens=8, temperature=0, ignore_eos=True)
    by_ids = complete(http, prompt=ids, max_tokens=8, temperature=0, ignore_eos=True)
    nested = complete(http, prompt=[ids], max_tokens=8, temperature=0, ignore_eos=True)
    assert texts(by_text) == texts(by_ids) == texts(nested)
    assert by_ids["usage"]["prompt_tokens"] == len(ids)


def test_list_of_prompts_gives_one_choice_each_in_order(http):
    prompts = ["import os\n", "class A:\n", "x = 1\n"]
    together = complete(http, prompt=prompts, max_tokens=6, temperature=0, ignore_eos=True)
    assert [c["index"] for c in together["choices"]] == [0, 1, 2]
    alone = [
        texts(complete(http, prompt=p, max_tokens=6, temperature=0, ignore_eos=True))[0]
        for p in prompts
    ]
    assert texts(together) == alone


def test_mixed_strings_and_ids_are_one_llamacpp_prompt(http, tokenizer):
    tail = tokenizer.encode("x = 1", add_special_tokens=False)
    result = complete(http, prompt=["import os\n", *tail], max_tokens=4, echo=True)
    assert len(result["choices"]) == 1
    assert result["choices"][0]["text"].startswith("import os\nx = 1")


def test_n_three_gives_indices_zero_to_two_and_different_texts(http):
    result = complete(http, prompt=PROMPT, n=3, max_tokens=12, seed=7, ignore_eos=True)
    assert [c["index"] for c in result["choices"]] == [0, 1, 2]
    assert len(set(texts(result))) == 3
    assert result["usage"]["completion_tokens"] == 36


def test_n_times_prompts_indexes_prompt_major(http):
    result = complete(http, prompt=["aaa", "bbb"], n=2, max_tokens=3, echo=True, ignore_eos=True)
    by_index = texts(result)
    assert [t[:3] for t in by_index] == ["aaa", "aaa", "bbb", "bbb"]


def test_best_of_returns_the_most_likely_choices(http):
    body = dict(prompt=PROMPT, max_tokens=10, seed=11, ignore_eos=True)
    all_three = complete(http, n=3, logprobs=0, **body)
    scores = [sum(c["logprobs"]["token_logprobs"]) for c in all_three["choices"]]
    best = complete(http, n=1, best_of=3, **body)
    assert texts(best) == [texts(all_three)[scores.index(max(scores))]]
    assert best["choices"][0]["logprobs"] is None  # scores were used, not asked for


def test_echo_prepends_the_prompt(http):
    plain = complete(http, prompt=PROMPT, max_tokens=5, seed=3, ignore_eos=True)
    echoed = complete(http, prompt=PROMPT, max_tokens=5, seed=3, echo=True, ignore_eos=True)
    assert texts(echoed)[0] == PROMPT + texts(plain)[0]


def test_logprobs_lists_are_parallel_and_bounded(http):
    k = 3
    result = complete(http, prompt=PROMPT, max_tokens=12, logprobs=k, seed=5, ignore_eos=True)
    choice = result["choices"][0]
    lp = choice["logprobs"]
    n = len(lp["tokens"])
    assert n == 12
    assert len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == n
    assert "".join(lp["tokens"]) == choice["text"]
    for token, logprob, top, offset, next_offset in zip(
        lp["tokens"],
        lp["token_logprobs"],
        lp["top_logprobs"],
        lp["text_offset"],
        lp["text_offset"][1:] + [len(choice["text"])],
    ):
        assert logprob <= 0 and math.isfinite(logprob)
        assert 1 <= len(top) <= k + 1
        assert top[token] == pytest.approx(logprob)
        assert all(v <= 0 for v in top.values())
        assert next_offset - offset == len(token)


def test_greedy_token_is_the_top_logprob(http):
    result = complete(http, prompt=PROMPT, max_tokens=6, logprobs=1, temperature=0)
    lp = result["choices"][0]["logprobs"]
    for logprob, top in zip(lp["token_logprobs"], lp["top_logprobs"]):
        assert logprob == pytest.approx(max(top.values()))


def test_echo_with_logprobs_scores_the_prompt(http, tokenizer):
    result = complete(http, prompt=PROMPT, max_tokens=4, logprobs=2, echo=True, seed=1)
    choice = result["choices"][0]
    lp = choice["logprobs"]
    prompt_len = len(tokenizer.encode(PROMPT))
    assert len(lp["tokens"]) == prompt_len + 4
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert all(x is not None for x in lp["token_logprobs"][1:])
    assert "".join(lp["tokens"]) == choice["text"]


def test_echo_logprobs_with_zero_max_tokens_scores_only_the_prompt(http, tokenizer):
    """The evaluation-harness call (lm-eval): score a text, generate nothing."""
    result = complete(http, prompt=PROMPT, max_tokens=0, logprobs=1, echo=True)
    choice = result["choices"][0]
    assert choice["text"] == PROMPT
    assert len(choice["logprobs"]["tokens"]) == len(tokenizer.encode(PROMPT))
    assert result["usage"]["completion_tokens"] == 0
    # The same scores as the prompt part of a generating request (prefix of the same forward).
    longer = complete(http, prompt=PROMPT, max_tokens=3, logprobs=1, echo=True)
    scores = choice["logprobs"]["token_logprobs"][1:]
    again = longer["choices"][0]["logprobs"]["token_logprobs"][1 : len(scores) + 1]
    assert again == pytest.approx(scores, abs=1e-4)


def test_unknown_harmless_fields_are_accepted(http):
    result = complete(
        http,
        prompt=PROMPT,
        max_tokens=2,
        user="me",
        cache_prompt=True,
        id_slot=3,
        some_future_field={"x": 1},
    )
    assert len(result["choices"]) == 1


def test_models_lists_the_served_model_first_and_marks_it_loaded(client):
    models = client.models.list().data
    assert models[0].id == "tiny" and models[0].loaded is True
    assert [m.loaded for m in models[1:]] == [False] * (len(models) - 1)
    assert "mlxserve-demo-coder" in [m.id for m in models]  # it ships in the package


def test_health_is_ok_when_ready(http):
    response = http.get("/health")
    assert response.status_code == 200 and response.json()["status"] == "ok"


def test_null_means_the_default_except_for_max_tokens(http):
    nulls = {
        name: None
        for name in (
            "n",
            "temperature",
            "top_p",
            "stream",
            "echo",
            "stop",
            "logit_bias",
            "presence_penalty",
            "best_of",
            "logprobs",
            "seed",
            "user",
            "stream_options",
            "repeat_penalty",
        )
    }
    result = complete(http, prompt=PROMPT, max_tokens=4, ignore_eos=True, **nulls)
    assert len(result["choices"]) == 1 and result["usage"]["completion_tokens"] == 4
    until_full = complete(http, prompt=NEAR_FULL_IDS, max_tokens=None, ignore_eos=True, n=None)
    assert until_full["usage"]["total_tokens"] == 2048


def test_llamacpp_mixed_prompt_list_is_one_prompt_per_element(http, tokenizer):
    """llama.cpp's `[[12, 34], "text"]`: a list of ids and a string, two prompts, two answers."""
    ids = tokenizer.encode("def f(x):", add_special_tokens=True)
    body = {"prompt": [ids, "import os\n"], "n_predict": 3, "temperature": 0, "ignore_eos": True}
    answers = http.post("/completion", json=body).json()
    assert isinstance(answers, list) and len(answers) == 2
    alone = http.post("/completion", json=body | {"prompt": "import os\n"}).json()
    assert answers[1]["content"] == alone["content"]
    assert answers[0]["tokens_evaluated"] == len(ids)


def test_n_cmpl_is_llamacpps_name_for_n(http):
    """llama.vscode asks for several infill candidates with n_cmpl; llama.cpp answers a list."""
    body = {"prompt": "x", "n_predict": 2, "n_cmpl": 3, "seed": 1, "temperature": 1.0}
    answers = http.post("/completion", json=body).json()
    assert isinstance(answers, list) and [a["index"] for a in answers] == [0, 1, 2]
    error = http.post("/completion", json={**body, "n_cmpl": 0}).json()["error"]
    assert error["param"] == "n_cmpl"
