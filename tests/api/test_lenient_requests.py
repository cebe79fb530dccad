"""What clients send by default and llama.cpp, LM Studio and Ollama accept: a fixed model name,
a max_tokens larger than the context leaves, /infill on a model without FIM tokens; and the
strict flags that restore OpenAI's errors."""

from __future__ import annotations

import httpx
import openai
import pytest

from mlxserve.settings import Limits

from ..helpers import complete

pytestmark = pytest.mark.http_only

CONTEXT = 2048  # the tiny model's
LONG_PROMPT_IDS = [1] + [300] * 1999  # 2000 tokens: 48 left to generate


def error_with_numbers(response: httpx.Response) -> dict:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == "prompt"
    return error


def test_a_name_the_server_does_not_know_is_answered_by_the_loaded_model(server, client):
    """The openai package's defaults, as a client that hard-codes a name sends them."""
    chat = client.chat.completions.create(
        model="gpt-3.5-turbo", messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    assert chat.model == "tiny" and chat.usage.completion_tokens >= 1
    completion = client.completions.create(model="davinci-002", prompt="x", max_tokens=2)
    assert completion.model == "tiny"
    with pytest.raises(openai.NotFoundError):  # retrieving a model by name still says 404
        client.models.retrieve("gpt-3.5-turbo")


def test_strict_model_names_refuse_other_names(live_server, tiny_model, tiny_models_dir):
    live = live_server(tiny_model, models_dirs=(str(tiny_models_dir),), strict_model_names=True)
    with httpx.Client(base_url=live.url, timeout=60) as http:
        response = http.post("/v1/completions", json={"prompt": "x", "model": "gpt-3.5-turbo"})
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "model_not_found"
        response = http.post("/v1/completions", json={"prompt": "x", "model": "tiny2"})
        assert response.status_code == 400
        assert response.json()["error"]["code"] == "model_not_loaded"
        assert complete(http, prompt="x", max_tokens=1, model="tiny")["model"] == "tiny"


def test_max_tokens_beyond_the_context_stops_when_it_is_full(http):
    result = complete(http, prompt=LONG_PROMPT_IDS, max_tokens=100, ignore_eos=True)
    assert result["choices"][0]["finish_reason"] == "length"
    assert result["usage"]["completion_tokens"] == CONTEXT - len(LONG_PROMPT_IDS)
    native = http.post(
        "/completion", json={"prompt": LONG_PROMPT_IDS, "n_predict": 100, "ignore_eos": True}
    ).json()
    assert native["tokens_predicted"] == CONTEXT - len(LONG_PROMPT_IDS)
    assert native["truncated"] is True and native["stop_type"] == "limit"
    short = http.post("/completion", json={"prompt": "x", "n_predict": 3, "ignore_eos": True})
    assert short.json()["truncated"] is False and short.json()["stop_type"] == "limit"


def test_a_chat_client_default_of_4096_on_a_2k_model(client):
    """Clients send max_tokens 4096 whatever the model; the tiny model's context is 2,048."""
    chat = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hello " * 500}],
        max_tokens=4096,
        extra_body={"ignore_eos": True},
    )
    assert chat.choices[0].finish_reason == "length"
    assert chat.usage.prompt_tokens + chat.usage.completion_tokens == CONTEXT


def test_a_prompt_that_fills_the_context_is_a_400_with_the_numbers(http):
    prompt = [1] + [300] * (CONTEXT + 9)
    error = error_with_numbers(http.post("/v1/completions", json={"prompt": prompt}))
    assert (error["n_prompt_tokens"], error["n_ctx"]) == (CONTEXT + 10, CONTEXT)
    assert str(CONTEXT + 10) in error["message"] and str(CONTEXT) in error["message"]
    assert error["type"] == "invalid_request_error"  # OpenAI's, on OpenAI's route
    native = error_with_numbers(http.post("/completion", json={"prompt": prompt}))
    assert native["type"] == "exceed_context_size_error"  # llama.cpp's, on its routes
    assert (native["n_prompt_tokens"], native["n_ctx"]) == (CONTEXT + 10, CONTEXT)
    truncated = complete(http, prompt=prompt, max_tokens=2, truncate_sequence=True)
    assert truncated["usage"]["prompt_tokens"] + truncated["usage"]["completion_tokens"] <= CONTEXT


def test_max_tokens_beyond_the_server_limit_is_lowered_to_it(live_server, tiny_model):
    live = live_server(tiny_model, limits=Limits(max_tokens=5))
    with httpx.Client(base_url=live.url, timeout=60) as http:
        result = complete(http, prompt="x", max_tokens=100, ignore_eos=True)
        assert result["usage"]["completion_tokens"] == 5
        assert result["choices"][0]["finish_reason"] == "length"


def test_strict_context_restores_openais_400s(live_server, tiny_model):
    live = live_server(tiny_model, strict_context=True, limits=Limits(max_tokens=500))
    with httpx.Client(base_url=live.url, timeout=60) as http:
        response = http.post("/v1/completions", json={"prompt": "x", "max_tokens": 501})
        assert response.status_code == 400
        assert response.json()["error"]["code"] == "max_tokens_exceeded"
        assert response.json()["error"]["param"] == "max_tokens"
        body = {"prompt": [1] + [300] * 1899, "max_tokens": 200}
        error = error_with_numbers(http.post("/v1/completions", json=body))
        assert (error["n_prompt_tokens"], error["n_ctx"]) == (1900, CONTEXT)
        for number in ("2048", "2100", "1900", "200"):
            assert number in error["message"]
        until_full = complete(http, prompt="x", max_tokens=-1, ignore_eos=True)
        assert until_full["usage"]["completion_tokens"] == 500  # the limit, not an error


def test_infill_without_a_suffix_on_a_model_without_fim_continues_the_prefix(server, http):
    assert server.engine.loaded.fim is None
    body = {"input_prefix": "def add(a, b):\n", "prompt": "    return", "n_predict": 4}
    answer = http.post("/infill", json={**body, "temperature": 0, "ignore_eos": True})
    assert answer.status_code == 200, answer.text
    plain = http.post(
        "/completion",
        json={
            "prompt": "def add(a, b):\n    return",
            "n_predict": 4,
            "temperature": 0,
            "ignore_eos": True,
        },
    )
    assert answer.json()["content"] == plain.json()["content"] != ""
    assert answer.json()["tokens_predicted"] == 4
