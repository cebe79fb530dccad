"""Every bad input gets an OpenAI-style error naming the field; never a 500."""

from __future__ import annotations

import socket
import time

import httpx
import openai
import pytest

from ..helpers import complete, error_of

# The HTTP contract alone: the platform policy does not change it (not in the portable pass).
pytestmark = pytest.mark.http_only

LONG_PROMPT_IDS = [1] + [300] * 1999  # 2000 tokens of a 2048-token context


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", -1),
        ("temperature", "hot"),
        ("top_p", 0),
        ("top_p", 1.5),
        ("top_k", -2),
        ("min_p", 2),
        ("n", 0),
        ("n", 129),
        ("best_of", 200),
        ("logprobs", 6),
        ("logprobs", -1),
        ("max_tokens", -5),
        ("presence_penalty", 3),
        ("frequency_penalty", -2.5),
        ("repetition_penalty", 0),
        ("repeat_last_n", -2),
        ("min_tokens", -1),
        ("seed", 2**64),
        ("stop", ["s"] * 17),
        ("stop", 5),
        ("logit_bias", {"abc": True}),
        ("logit_bias", [[1, 2, 3]]),
        ("logit_bias", [[1, "x"]]),
        ("logit_bias", {"5": 200}),
        ("context_length_exceeded_behavior", "explode"),
        ("truncate_prompt_tokens", 0),
        ("stream_options", {"include_usage": "maybe"}),
        ("prompt", []),
        ("prompt", [[]]),
        ("prompt", 5),
        ("prompt", [{"a": 1}]),
        ("echo", "sometimes"),
        ("mirostat", 3),
        ("mirostat_tau", 0),
        ("mirostat_target", -1),
        ("mirostat_eta", 2),
        ("mirostat_lr", 0),
        ("typical_p", 0),
        ("top_n_sigma", -3),
        ("xtc_probability", 1.5),
        ("xtc_threshold", -0.1),
        ("dynatemp_range", -1),
        ("dynatemp_exponent", 0),
        ("dry_multiplier", -1),
        ("dry_allowed_length", -1),
        ("dry_penalty_last_n", -2),
        ("dry_sequence_breakers", "\n"),
        ("dry_sequence_breakers", ["x"] * 33),
        ("samplers", ["top_k", "nucleus"]),
        ("samplers", "kz"),
        ("response_format", {"type": "xml"}),
        ("grammar", {"type": "yaml", "value": "x"}),
        ("guided_choice", []),
        ("tool_choice", "sometimes"),
        ("tools", [{"type": "function", "function": {"name": ""}}]),
    ],
)
def test_bad_values_are_400_naming_the_field(http, field, value):
    response = http.post("/v1/completions", json={"prompt": "x", field: value})
    error = error_of(response, 400)
    assert error["type"] == "invalid_request_error"
    assert error["param"].split(".")[0] == field, error
    assert field in error["message"]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("prompt_logprobs", 1),
        ("use_beam_search", True),
    ],
)
def test_fields_not_built_yet_are_refused_by_name_not_ignored(http, field, value):
    error = error_of(http.post("/v1/completions", json={"prompt": "x", field: value}), 400)
    assert error["param"] == field and error["code"] == "unsupported_parameter"


@pytest.mark.parametrize(
    ("field", "off"),
    [("suffix", ""), ("grammar", ""), ("tools", []), ("response_format", {"type": "text"})],
)
def test_their_off_values_are_accepted(http, field, off):
    complete(http, prompt="x", max_tokens=1, **{field: off})


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "x", "n": 3, "best_of": 2}, "best_of"),
        ({"prompt": "x", "best_of": 3, "stream": True}, "best_of"),
        ({"prompt": "x", "max_tokens": 3, "min_tokens": 5}, "min_tokens"),
        ({"prompt": "x", "dry_multiplier": 0.8, "dry_base": 0.5}, "dry_base"),
        ({"prompt": [5, 99999]}, "prompt"),
        ({"prompt": "x", "stop_token_ids": [99999]}, "stop_token_ids"),
        ({"prompt": "x", "logit_bias": {"99999": 1}}, "logit_bias"),
        ({"prompt": "x", "allowed_token_ids": [-3]}, "allowed_token_ids"),
        ({"prompt": ["a"] * 100, "n": 3}, "n"),
        ({}, "prompt"),
    ],
)
def test_inconsistent_requests_are_400(http, body, param):
    assert error_of(http.post("/v1/completions", json=body), 400)["param"] == param


def test_openai_client_sees_a_bad_request_error(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="tiny", prompt="x", temperature=-1)
    assert caught.value.status_code == 400
    assert caught.value.body["param"] == "temperature"


def test_malformed_json_and_non_objects_are_400(http):
    for raw in (b"{bad", b"[1, 2]", b"\xff\xfe", b"", b'{"prompt": "x", "temperature": NaN}'):
        response = http.post(
            "/v1/completions", content=raw, headers={"Content-Type": "application/json"}
        )
        error_of(response, 400)


def test_body_without_json_content_type_is_still_read(http):
    """curl -d sends form encoding; the body is JSON all the same."""
    response = http.post(
        "/v1/completions",
        content=b'{"prompt": "x", "max_tokens": 1}',
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert response.status_code == 200


def test_unknown_route_404_and_wrong_method_405(http):
    error_of(http.get("/v1/nothing"), 404)
    error_of(http.get("/v1/completions"), 405)


def test_body_over_the_limit_is_413(http):
    response = http.post("/v1/completions", content=b"x" * (9 * 1024 * 1024))
    assert error_of(response, 413)["code"] == "request_too_large"


@pytest.mark.parametrize(
    "policy",
    [
        {"context_length_exceeded_behavior": "truncate"},  # Fireworks
        {"truncate_sequence": True},  # mistral.rs
    ],
)
def test_truncation_shrinks_max_tokens_first(http, policy):
    result = complete(http, prompt=LONG_PROMPT_IDS, max_tokens=100, ignore_eos=True, **policy)
    assert result["usage"]["prompt_tokens"] == 2000
    assert result["usage"]["completion_tokens"] == 48


def test_truncation_then_drops_the_oldest_prompt_tokens(http):
    ids = [1] + [300] * 2099 + [301]
    result = complete(
        http,
        prompt=ids,
        max_tokens=5,
        truncate_sequence=True,
        logprobs=0,
        echo=True,
        ignore_eos=True,
    )
    assert result["usage"]["prompt_tokens"] == 2047
    assert result["usage"]["completion_tokens"] == 1


def test_truncate_prompt_tokens_keeps_the_last_n(http):
    """vLLM's truncate_prompt_tokens: the prompt's last N tokens are kept."""
    result = complete(http, prompt=LONG_PROMPT_IDS, max_tokens=3, truncate_prompt_tokens=10)
    assert result["usage"]["prompt_tokens"] == 10


def test_n_keep_keeps_the_first_tokens_of_a_cut_prompt(http):
    """llama.cpp's n_keep: where the prompt is cut, its first n_keep tokens stay before its end."""
    ids = list(range(100, 140))
    result = complete(
        http, prompt=ids, max_tokens=1, truncate_prompt_tokens=10, n_keep=3, return_token_ids=True
    )
    assert result["choices"][0]["prompt_token_ids"] == ids[:3] + ids[-7:]


def test_api_key_is_required_everywhere_but_health_and_models(live_server, tiny_model):
    live = live_server(tiny_model, api_key="s3cret")
    with httpx.Client(base_url=live.url, timeout=60) as http:
        assert http.get("/health").status_code == 200
        # llama.cpp's /models is open, as /health; OpenAI's /v1/models needs the key.
        assert http.get("/models").json()["data"][0]["loaded"] is True
        body = {"prompt": "x", "max_tokens": 1}
        missing = error_of(http.post("/v1/completions", json=body), 401)
        assert missing["code"] == "missing_api_key"
        wrong = {"Authorization": "Bearer nope"}
        error_of(http.post("/v1/completions", json=body, headers=wrong), 401)
        error_of(http.get("/v1/models", headers=wrong), 401)
        for path in ("/infill", "/completion", "/admin/load", "/admin/unload", "/tokenize"):
            error_of(http.post(path, json=body), 401)
        for path in ("/admin/status", "/props", "/slots"):
            error_of(http.get(path), 401)
        ok = http.post("/v1/completions", json=body, headers={"X-Api-Key": "s3cret"})
        assert ok.status_code == 200
    assert_refusals_keep_the_connection(live.settings.port)
    client = openai.OpenAI(base_url=live.url + "/v1", api_key="s3cret", max_retries=0)
    assert client.completions.create(model="tiny", prompt="x", max_tokens=1).choices
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=live.url + "/v1", api_key="bad", max_retries=0).models.list()


def assert_refusals_keep_the_connection(port: int) -> None:
    """A 401 decided from the headers alone waits for the body, so the connection stays usable.

    Refused mid-body, Hypercorn used to drop the connection under a client already reusing it
    (CI: "Server disconnected without sending a response").
    """
    body = b'{"prompt": "x"}'
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    )
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        for _ in range(2):
            sock.sendall(head)
            time.sleep(0.3)  # the auth check has long answered by now
            sock.sendall(body)
            answer = b""
            while b"authentication_error" not in answer:
                chunk = sock.recv(65536)
                assert chunk, f"connection closed after {answer!r}"
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 401") and b"connection: close" not in answer.lower()


def test_503_while_the_model_loads(live_server, tiny_model):
    live = live_server(tiny_model, own=True, start_engine=False)  # it starts the engine
    with httpx.Client(base_url=live.url, timeout=60) as http:
        health = http.get("/health")
        assert health.status_code == 503 and health.json()["status"] in ("starting", "loading")
        response = http.post("/v1/completions", json={"prompt": "x"})
        assert error_of(response, 503)["code"] == "model_loading"
        assert response.headers["Retry-After"] == "1"
        live.engine.start()
        assert live.engine.wait_ready(300)
        ready = http.post("/v1/completions", json={"prompt": "x", "max_tokens": 1})
        assert ready.status_code == 200


def test_503_after_the_model_failed_to_load_says_so(live_server, tiny_models_dir):
    live = live_server(str(tiny_models_dir / "broken"), own=True, start_engine=False)
    live.engine.start()
    assert not live.engine.wait_ready(300) and live.engine.state == "error"
    with httpx.Client(base_url=live.url, timeout=60) as http:
        error = error_of(http.post("/v1/completions", json={"prompt": "x"}), 503)
        assert error["code"] == "model_unavailable" and "broken" in error["message"]
