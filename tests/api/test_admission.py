"""Admission control: a KV budget refused up front, a bounded queue answered with 503."""

from __future__ import annotations

import httpx
import pytest

from ..helpers import complete

# The HTTP contract alone: the platform policy does not change it (not in the portable pass).
pytestmark = pytest.mark.http_only


@pytest.fixture
def small_server(live_server, tiny_model):
    # The tiny model's KV takes 512 bytes a token: a budget of 300 tokens, and no queue.
    return live_server(tiny_model, kv_budget_bytes=300 * 512, max_queued_sequences=0)


def test_a_request_over_the_kv_budget_is_a_clear_400_and_serving_goes_on(small_server):
    with httpx.Client(base_url=small_server.url, timeout=60) as http:
        response = http.post("/v1/completions", json={"prompt": "x", "max_tokens": 400})
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["code"] == "kv_budget_exceeded" and "MiB of KV cache" in error["message"]
        too_many = http.post("/v1/completions", json={"prompt": "x", "max_tokens": 20, "n": 20})
        assert too_many.status_code == 400
        assert complete(http, prompt="x", max_tokens=4, ignore_eos=True)["choices"][0]["text"]


def test_a_full_queue_answers_503_with_retry_after(small_server):
    engine = small_server.engine
    with httpx.Client(base_url=small_server.url, timeout=60) as http:
        body = {"prompt": "x", "max_tokens": 6, "n": 32, "ignore_eos": True, "stream": True}
        with http.stream("POST", "/v1/completions", json=body) as running:
            lines = running.iter_lines()
            next(line for line in lines if line.startswith("data: "))  # the batch is full now
            assert engine.pending_sequences == 32
            busy = http.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
            assert busy.status_code == 503
            assert busy.headers["Retry-After"] == "1"
            assert busy.json()["error"]["code"] == "server_busy"
            for _ in lines:  # let the running request finish
                pass
        assert engine.pending_sequences == 0
        assert complete(http, prompt="x", max_tokens=2)["choices"]
