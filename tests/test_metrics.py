"""Engine counters on GET /metrics, and llama.cpp-style timings when a request asks."""

from __future__ import annotations

import re

from .helpers import complete, stream_chunks


def metric(http, name: str) -> float:
    text = http.get("/metrics").text
    match = re.search(rf"^mlxserve_{name} (\S+)$", text, re.MULTILINE)
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
    assert metric(http, "queue_depth") == 0 and metric(http, "batch_size") == 0


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
