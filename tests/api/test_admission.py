"""Admission control: a KV budget refused up front, a bounded queue answered with 503."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from mlxserve.api.admission import admit
from mlxserve.api.errors import ServiceUnavailable
from mlxserve.engine import GenerationRequest
from mlxserve.sampling.params import SamplingParams

from ..helpers import complete, wait_until

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


ARRIVING = 24


def test_streams_arriving_together_are_admitted_as_the_budget_holds(live_server, tiny_model):
    """A stream's sequences start only once its response does: each request arriving at once
    must still count those admitted just before it."""
    server = live_server(tiny_model, own=True, kv_budget_bytes=2 * 1100 * 512)  # 2 of these
    body = {"prompt": [5 + i % 900 for i in range(1000)], "max_tokens": 100, "stream": True}

    answered = threading.Barrier(ARRIVING, timeout=60)

    def status(_) -> int:
        with httpx.Client(base_url=server.url, timeout=60) as http:
            with http.stream("POST", "/v1/completions", json=body) as response:
                answered.wait()  # every request answered before any hangs up
                return response.status_code

    with ThreadPoolExecutor(ARRIVING) as pool:
        codes = sorted(pool.map(status, range(ARRIVING)))
    assert codes == [200] * 2 + [503] * (ARRIVING - 2)
    assert wait_until(lambda: server.engine.admitted_sequences == 0, timeout=30)


def test_an_admitted_request_counts_before_its_sequences_start(live_server, tiny_model):
    """A stream is admitted before its response starts its sequences: until then its place is
    reserved, so a request admitted right after it sees it."""
    server = live_server(tiny_model, own=True, kv_budget_bytes=300 * 512)
    engine, settings = server.engine, server.settings
    greedy = SamplingParams(temperature=0.0)
    sequences = [GenerationRequest((5,) * 100, 100, greedy, seed=0)]  # 200 of 300 tokens
    loaded = engine.check_ready()
    admit(engine, loaded, sequences, settings)
    assert engine.admitted_sequences == 1 and engine.pending_sequences == 0
    with pytest.raises(ServiceUnavailable):
        admit(engine, loaded, sequences, settings)
