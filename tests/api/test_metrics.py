"""Engine counters on GET /metrics, and llama.cpp-style timings when a request asks."""

from __future__ import annotations

import re

import pytest

from ..helpers import complete, stream_chunks, wait_until

# The HTTP contract alone: the platform policy does not change it (not in the portable pass).
pytestmark = pytest.mark.http_only


def metric(http, name: str) -> float:
    text = http.get("/metrics").text
    match = re.search(rf"^mlxserve_{name}(?:{{model=\"[^\"]*\"}})? (\S+)$", text, re.MULTILINE)
    assert match, f"mlxserve_{name} missing from /metrics"
    return float(match.group(1))


def test_metrics_count_generated_tokens_and_report_a_rate(http):
    response = http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    assert "# TYPE mlxserve_generated_tokens_total counter" in response.text
    before = metric(http, "generated_tokens_total")
    complete(http, prompt="metrics", max_tokens=20, ignore_eos=True)
    assert metric(http, "generated_tokens_total") == before + 20
    assert metric(http, "tokens_per_second") > 0
    # The engine thread recounts its batch just after the last token is posted.
    assert wait_until(lambda: metric(http, "queue_depth") == 0 and metric(http, "batch_size") == 0)


def test_timings_when_asked(http):
    plain = complete(http, prompt="timings", max_tokens=5, ignore_eos=True)
    assert "timings" not in plain
    result = complete(http, prompt="timings", max_tokens=5, ignore_eos=True, timings_per_token=True)
    timings = result["timings"]
    assert timings["predicted_n"] == 5
    assert timings["prompt_n"] + timings["cache_n"] == result["usage"]["prompt_tokens"]
    assert timings["prompt_ms"] > 0 and timings["predicted_per_second"] > 0


def test_streamed_final_chunk_carries_timings(http):
    chunks = stream_chunks(
        http, prompt="timings", max_tokens=4, ignore_eos=True, timings_per_token=True
    )
    finals = [c for c in chunks if isinstance(c, dict) and c["choices"][0]["finish_reason"]]
    assert finals and finals[-1]["timings"]["predicted_n"] == 4


def test_prometheus_histograms_and_request_counts(http):
    def sample(name: str, labels: str = "") -> float:
        text = http.get("/metrics").text
        pattern = rf"^mlxserve_{name}{re.escape(labels)} (\S+)$"
        match = re.search(pattern, text, re.MULTILINE)
        return float(match.group(1)) if match else 0.0

    route = '{method="POST",route="/v1/completions",status="200"}'
    before = sample("http_requests_total", route)
    ttft = sample("time_to_first_token_seconds_count")
    duration = sample("generation_duration_seconds_count")
    complete(http, prompt="histograms", max_tokens=3)
    stream_chunks(http, prompt="histograms", max_tokens=3)
    assert sample("http_requests_total", route) == before + 2
    assert sample("time_to_first_token_seconds_count") == ttft + 2
    assert sample("generation_duration_seconds_count") == duration + 2
    bad = '{method="POST",route="/v1/completions",status="400"}'
    refused = sample("http_requests_total", bad)
    http.post("/v1/completions", json={"prompt": "x", "n": 0})
    assert sample("http_requests_total", bad) == refused + 1
    text = http.get("/metrics").text
    assert "# TYPE mlxserve_time_to_first_token_seconds histogram" in text
    assert 'mlxserve_generation_duration_seconds_bucket{le="+Inf"}' in text
    # Unknown paths share one label: a scanner cannot grow the label set.
    http.get("/no/such/path/1")
    http.get("/no/such/path/2")
    assert 'route="unmatched",status="404"' in http.get("/metrics").text
    assert "/no/such/path" not in http.get("/metrics").text
