"""llama.cpp's GET /slots on a real server: a slot per batch row, what runs in it, and the 503 a
client asking for a free slot gets when there is none."""

from __future__ import annotations

import json
import threading
import time

import httpx

from mlxserve.engine import MAX_BATCH

from ..helpers import error_of

LONG = {"n_predict": 400, "ignore_eos": True}


def wait_for(check, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError("timed out")


def test_idle_slots_are_listed_one_per_batch_row(server, http):
    slots = wait_for(
        lambda: (s := http.get("/slots").json()) and not any(x["is_processing"] for x in s) and s
    )
    assert [s["id"] for s in slots] == list(range(MAX_BATCH))
    assert len(slots) == http.get("/props").json()["total_slots"]
    for slot in slots:
        assert slot["n_ctx"] == server.engine.loaded.context_length
        assert slot["id_task"] == -1 and slot["speculative"] is False
        assert slot["next_token"]["n_decoded"] == 0


def test_a_running_completion_shows_in_its_slot_with_its_settings(http, server):
    body = {"prompt": "Once upon", "temperature": 0.5, "top_k": 7, "seed": 11, **LONG}
    with http.stream("POST", "/completion", json={**body, "stream": True}) as response:
        lines = response.iter_lines()
        first = json.loads(next(line for line in lines if line.startswith("data: "))[6:])
        busy = wait_for(lambda: [s for s in http.get("/slots").json() if s["is_processing"]])
        assert len(busy) == 1
        slot = busy[0]
        assert slot["id"] == first["id_slot"]  # the stream names the slot it runs in
        params = slot["params"]
        assert (params["temperature"], params["top_k"], params["seed"]) == (0.5, 7, 11)
        assert params["n_predict"] == 400 and params["ignore_eos"] is True
        progress = slot["next_token"]
        assert 1 <= progress["n_decoded"] <= 400
        assert progress["n_remain"] == 400 - progress["n_decoded"]
    wait_for(lambda: not any(s["is_processing"] for s in http.get("/slots").json()))


def test_final_answer_names_its_slot(http):
    answer = http.post("/completion", json={"prompt": "a", "n_predict": 2}).json()
    assert 0 <= answer["id_slot"] < MAX_BATCH


def test_fail_on_no_slot_is_a_503_only_while_every_slot_is_busy(http, server):
    assert http.get("/slots", params={"fail_on_no_slot": 1}).status_code == 200
    body = {"prompt": "x", "n": MAX_BATCH, "max_tokens": 300, "ignore_eos": True, "stream": True}
    started = threading.Event()

    def fill_the_batch():
        with httpx.Client(base_url=str(http.base_url), timeout=120) as own:
            with own.stream("POST", "/v1/completions", json=body) as response:
                for _ in response.iter_lines():
                    started.set()

    filler = threading.Thread(target=fill_the_batch)
    filler.start()
    try:
        assert started.wait(60)
        error = error_of(http.get("/slots", params={"fail_on_no_slot": 1}), 503)
        assert "slot" in error["message"]
        assert http.get("/slots").status_code == 200  # without the flag: the slots, busy
    finally:
        filler.join(120)
    wait_for(lambda: http.get("/slots", params={"fail_on_no_slot": 1}).status_code == 200)


def test_slot_save_restore_erase_are_refused_clearly(http):
    for action in ("save", "restore", "erase"):
        response = http.post("/slots/0", params={"action": action}, json={"filename": "slot.bin"})
        error = error_of(response, 501)
        assert error["type"] == "not_supported_error" and "prefix cache" in error["message"]
    error = error_of(http.post("/slots/0", params={"action": "bogus"}), 400)
    assert "bogus" in error["message"]
