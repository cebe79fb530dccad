"""A request whose row fails mid-step (tests/faults.py, the `faults` fixture) gets a 500 in its
protocol's shape, or an error at the end of its stream; a request beside it answers exactly as
it does alone."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from ..helpers import error_of, stream_chunks

BODY = {"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0.9, "seed": 5}


def test_a_failing_request_fails_alone(http, faults):
    alone = http.post("/v1/completions", json=BODY).json()["choices"][0]["text"]
    faulty = {**BODY, "user": "mlxserve-fault:sampler:2"}
    with ThreadPoolExecutor(2) as pool:
        failed = pool.submit(http.post, "/v1/completions", json=faulty)
        beside = pool.submit(http.post, "/v1/completions", json=BODY)
        error = error_of(failed.result(), 500)
        assert beside.result().json()["choices"][0]["text"] == alone
    assert error["type"] == "server_error" and "injected fault in the sampler" in error["message"]
    streamed = stream_chunks(
        http, "/v1/completions", **{**faulty, "user": "mlxserve-fault:detokenizer:3"}
    )
    assert "detokenizer" in streamed[-1]["error"]["message"]
    assert http.post("/v1/completions", json=BODY).json()["choices"][0]["text"] == alone


def test_without_the_tests_faults_a_user_label_is_only_a_label(http):
    """The server never reads `user` for faults: only the tests' wrappers do."""
    body = {**BODY, "user": "mlxserve-fault:sampler:0"}
    assert http.post("/v1/completions", json=body).status_code == 200


@pytest.mark.parametrize("stage", ["forward:3", "prefill"])
def test_a_request_failing_in_the_models_pass_fails_alone(http, faults, stage):
    """The batch's pass itself raises while it holds the faulty row: the step is taken again
    without it, and the request beside it answers as it does alone."""
    alone = http.post("/v1/completions", json=BODY).json()["choices"][0]["text"]
    faulty = {**BODY, "user": f"mlxserve-fault:{stage}"}
    with ThreadPoolExecutor(2) as pool:
        beside = pool.submit(http.post, "/v1/completions", json=BODY)
        failed = pool.submit(http.post, "/v1/completions", json=faulty)
        error = error_of(failed.result(), 500)
        assert beside.result().json()["choices"][0]["text"] == alone
    assert error["type"] == "server_error" and "the model's pass failed" in error["message"]
