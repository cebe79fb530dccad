"""llama.cpp's forms of `logit_bias` on a real server: [id or text, bias or false] pairs and text
keys, each token of a text biased, `false` for never."""

from __future__ import annotations

from ..helpers import error_of

PROMPT = "Once upon a time"


def greedy_tokens(http, n_predict: int = 6, **body) -> list[int]:
    request = {
        "prompt": PROMPT,
        "temperature": 0,
        "n_predict": n_predict,
        "ignore_eos": True,
        "return_tokens": True,
        **body,
    }
    response = http.post("/completion", json=request)
    assert response.status_code == 200, response.text
    return response.json()["tokens"]


def tokens_of(http, text: str) -> list[int]:
    return http.post("/tokenize", json={"content": text}).json()["tokens"]


def test_false_bans_a_token_by_id_as_a_pair(http):
    first = greedy_tokens(http)[0]
    assert greedy_tokens(http, logit_bias=[[first, False]])[0] != first
    assert greedy_tokens(http, logit_bias={str(first): False})[0] != first


def test_a_text_key_biases_each_of_its_tokens(http):
    unbiased = greedy_tokens(http, n_predict=12)
    text = http.post("/detokenize", json={"tokens": unbiased[:3]}).json()["content"]
    ids = set(tokens_of(http, text))
    for form in ([[text, False]], {text: False}, [[text, -100]]):
        banned = greedy_tokens(http, n_predict=12, logit_bias=form)
        assert not ids & set(banned), (form, banned)
    forced_text = " zebra"
    forced_ids = set(tokens_of(http, forced_text))
    forced = greedy_tokens(http, logit_bias=[[forced_text, 100]])
    assert set(forced) <= forced_ids


def test_biases_of_one_token_add_up(http):
    target = tokens_of(http, " zebra")[0]
    assert greedy_tokens(http, n_predict=1, logit_bias=[[target, 50], [target, 50]]) == [target]


def test_the_same_forms_work_on_openais_completions(http):
    first = greedy_tokens(http, n_predict=1)
    native = {"prompt": PROMPT, "n_predict": 1, "temperature": 0}
    first_text = http.post("/completion", json=native).json()["content"]
    body = {"prompt": PROMPT, "max_tokens": 1, "temperature": 0}
    assert http.post("/v1/completions", json=body).json()["choices"][0]["text"] == first_text
    for bias in ({str(first[0]): -100}, [[first[0], False]]):
        answer = http.post("/v1/completions", json={**body, "logit_bias": bias}).json()
        assert answer["choices"][0]["text"] != first_text


def test_bad_forms_are_400_naming_logit_bias(http):
    for bias in ([["", 5]], {"": 5}, [[10**9, 1]], [[1, True]], [[1]], {"x": "high"}):
        error = error_of(http.post("/completion", json={"prompt": "x", "logit_bias": bias}), 400)
        assert error["param"].startswith("logit_bias"), (bias, error)
