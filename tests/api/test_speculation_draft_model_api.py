"""`--draft-model` as clients see it: a server started with one says so in /props and the
default model's card, drafts from it (counted in /metrics) and answers the same greedy text as
with `num_draft_tokens: 0`; a draft model with another tokenizer stops the server at start with
one line that says why."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from ..helpers import wait_healthy, wait_until
from ..live_server import free_port

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from make_draft_model import truncate  # noqa: E402

GREEDY = {"prompt": "Once upon a time", "temperature": 0, "max_tokens": 40, "ignore_eos": True}


@pytest.fixture(scope="module")
def draft_server(tiny_model, tmp_path_factory):
    """(a client of the server, its draft model's path, the file its log goes to)."""
    folder = tmp_path_factory.mktemp("draft")
    draft = truncate(tiny_model, folder / "tiny-1-layer", layers=1)
    port, log = free_port(), folder / "server.log"
    command = [sys.executable, "-m", "mlxserve", "serve", "--model", str(tiny_model)]
    command += ["--draft-model", str(draft), "--num-draft-tokens", "4", "--port", str(port)]
    command += ["--spec-fixed-width"]  # rows draft in every step, whatever the timings say
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url)
        with httpx.Client(base_url=url, timeout=60) as http:
            yield http, str(draft), log
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_props_and_the_default_models_card_name_the_draft_model(draft_server):
    http, draft, _ = draft_server
    props = http.get("/props").json()["default_generation_settings"]
    assert props["speculative"] is True and props["params"]["speculative.n_max"] == 4
    (card,) = [m for m in http.get("/v1/models").json()["data"] if m.get("default")]
    assert card["speculative"] == {
        "type": "draft_model",
        "num_draft_tokens": 4,
        "draft_model": draft,
    }


def test_greedy_text_with_the_draft_models_drafts_is_the_text_without(draft_server):
    http, _, _ = draft_server
    on = http.post("/v1/completions", json=GREEDY).json()
    off = http.post("/v1/completions", json={**GREEDY, "num_draft_tokens": 0}).json()
    assert on["choices"][0]["text"] == off["choices"][0]["text"]
    assert on["usage"]["completion_tokens"] == off["usage"]["completion_tokens"] == 40


def test_a_draft_model_with_another_tokenizer_stops_the_server_saying_why(tiny_model, tiny_coder):
    result = subprocess.run(
        [sys.executable, "-m", "mlxserve", "serve", "--model", str(tiny_model)]
        + ["--draft-model", str(tiny_coder), "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert f"--draft-model {tiny_coder} for {tiny_model}: its tokenizer differs" in result.stderr


def test_timings_and_the_access_log_count_each_requests_drafts(draft_server):
    """llama.cpp's `timings` carry `draft_n` and `draft_n_accepted` where the request drafted
    (and not otherwise, as llama.cpp's server), and its access-log line the same counts."""
    http, _, log = draft_server
    body = {"prompt": "Once upon a time", "temperature": 0, "n_predict": 40, "ignore_eos": True}
    sent = []
    for i in range(6):
        agent = f"draft-counting-{i}"
        asked = body if i % 3 else {**body, "num_draft_tokens": 0}
        timings = http.post("/completion", json=asked, headers={"User-Agent": agent}).json()
        sent.append((agent, asked, timings["timings"]))

    def line_of(agent: str) -> str | None:
        return next((line for line in log.read_text().splitlines() if agent in line), None)

    assert wait_until(lambda: all(line_of(agent) for agent, _, _ in sent))
    for agent, asked, timings in sent:
        counts = re.search(r"draft_tokens=(\d+) draft_accepted=(\d+)", line_of(agent))
        if "draft_n" not in timings:
            assert counts is None and "draft_n_accepted" not in timings
            continue
        assert asked.get("num_draft_tokens") != 0
        assert 0 <= timings["draft_n_accepted"] <= timings["draft_n"]
        assert counts and (int(counts[1]), int(counts[2])) == (
            timings["draft_n"],
            timings["draft_n_accepted"],
        )
    drafted = [agent for agent, _, timings in sent if "draft_n" in timings]
    assert len(drafted) == 4  # every request that did not turn drafting off
