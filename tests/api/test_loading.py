"""While the first model loads (issue 32, first run): /health and /admin/status say what the load
is doing, /v1/models does not call the model loaded, and a request waits for the load (up to
LOAD_WAIT_S) instead of a 503 the openai client gives up on in seconds."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from mlxserve.api.dispatch import LOAD_WAIT_S

from ..conftest import SMOLLM2, shared_model

# A real load (SmolLM2, seconds on OpenBLAS) is the only one long enough to watch; the portable
# pass's takes longer than LOAD_WAIT_S, and the policy does not change this contract.
pytestmark = pytest.mark.http_only

PHASES = ["reading config and tokenizer", "reading weights", "converting weights", "calibrating"]


def test_the_first_load_reports_its_progress_and_requests_wait_for_it(live_server):
    model = shared_model(SMOLLM2)
    live = live_server(model, own=True, start_engine=False)  # it starts the engine
    answered: list[tuple[int, float]] = []

    def complete() -> None:
        response = httpx.post(
            live.url + "/v1/completions",
            json={"prompt": "Hello", "max_tokens": 1},
            timeout=LOAD_WAIT_S + 60,
        )
        answered.append((response.status_code, time.monotonic()))

    with httpx.Client(base_url=live.url, timeout=10) as http:
        started = time.monotonic()
        live.engine.start()
        waiting = threading.Thread(target=complete)
        waiting.start()
        card = http.get(f"/v1/models/{model.name}").json()
        assert (card["loaded"], card["status"]) == (False, "loading")
        status = http.get("/admin/status").json()
        assert status["state"] == "loading" and status["progress"]["phase"] in ["starting", *PHASES]
        seen = []
        while (health := http.get("/health")).status_code == 503:
            assert health.json()["error"]["code"] == "model_loading"
            progress = health.json()["progress"]
            if not seen or seen[-1]["phase"] != progress["phase"]:
                seen.append(progress)
            time.sleep(0.05)
        loaded_after = time.monotonic() - started
        waiting.join(LOAD_WAIT_S + 60)

    phases = [p["phase"] for p in seen if p["phase"] != "starting"]
    assert phases == [phase for phase in PHASES if phase in phases] and "calibrating" in phases
    weights = model / "model.safetensors"
    calibrating = next(p for p in seen if p["phase"] == "calibrating")
    assert (calibrating["weight_files"], calibrating["weight_bytes"]) == (1, weights.stat().st_size)
    assert 0 <= calibrating["phase_elapsed_s"] <= calibrating["elapsed_s"] <= loaded_after
    ((status_code, answered_at),) = answered
    if loaded_after < LOAD_WAIT_S - 1:
        assert status_code == 200 and answered_at - started >= loaded_after - 0.5
    else:  # a machine this slow: the bounded wait ran out first
        assert status_code == 503 and answered_at - started >= LOAD_WAIT_S
    ready = httpx.get(live.url + "/admin/status", timeout=60).json()
    assert ready["state"] == "ready" and ready["progress"] is None
    card = httpx.get(f"{live.url}/v1/models/{model.name}", timeout=60).json()
    assert (card["loaded"], card["status"]) == (True, "ready")
