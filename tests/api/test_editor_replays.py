"""Editors' own request sequences, replayed on the default model end to end: llama.vscode's
(src/llama-server.ts and extra-context.ts at v0.0.63: its model checks, the ring buffer's
warm-up, then completions with `n_cmpl` 3) and Continue's llama.cpp provider
(core/llm/llms/LlamaCpp.ts: a FIM prompt it renders itself, streamed from /completion).

Slow: the default model's 4-bit weights are run in the CPU pass only, as in test_demo_model.py."""

from __future__ import annotations

import json

import httpx
import pytest

from mlxserve.settings import DEFAULT_MODEL

pytestmark = pytest.mark.slow

PREFIX = (
    "import os\n\n\ndef list_files(path):\n    result = []\n    for name in os.listdir(path):\n"
)
SUFFIX = "\n    return result\n"
OTHER_FILE = {
    "text": "def sorted_names(values):\n    return sorted(v.name for v in values)\n",
    "time": 1764200000000,
    "filename": "/home/user/project/util.py",
}


@pytest.fixture(scope="module")
def demo(live_servers):
    """The session's default-model server, test_demo_model.py's too (one worker runs both)."""
    with httpx.Client(base_url=live_servers.shared(DEFAULT_MODEL).url, timeout=120) as http:
        yield http


def test_llama_vscode_checks_the_model_then_completes(demo):
    assert demo.get("/health").json()["status"] == "ok"
    n_ctx = demo.get("/props").json()["default_generation_settings"]["n_ctx"]
    assert n_ctx >= 2048
    assert demo.get("/v1/models").json()["data"][0]["id"] == "mlxserve-demo-coder"
    counted = demo.post(
        "/tokenize", json={"content": PREFIX, "add_special": False, "parse_special": True}
    ).json()
    assert len(counted["tokens"]) > 10
    messages = [
        {"role": "system", "content": "You are an expert coder."},
        {"role": "user", "content": "List the files."},
    ]
    rendered = demo.post("/apply-template", json={"messages": messages}).json()["prompt"]
    assert "List the files." in rendered
    # The ring buffer's warm-up: other files' chunks alone, nothing generated, answer unread.
    warm_up = {
        "id_slot": 0,
        "input_prefix": "",
        "input_suffix": "",
        "input_extra": [OTHER_FILE],
        "prompt": "",
        "n_predict": 0,
        "samplers": [],
        "cache_prompt": True,
        "t_max_prompt_ms": 500,
        "t_max_predict_ms": 1,
    }
    assert demo.post("/infill", json=warm_up).status_code == 200
    completion = {
        "id_slot": 0,
        "input_prefix": PREFIX,
        "input_suffix": SUFFIX,
        "input_extra": [OTHER_FILE],
        "prompt": "        ",
        "n_predict": 128,
        "n_cmpl": 3,
        "top_k": 40,
        "top_p": 0.99,
        "stream": False,
        "samplers": ["top_k", "top_p", "infill"],
        "cache_prompt": True,
        "n_indent": 8,
        "t_max_prompt_ms": 500,
        "t_max_predict_ms": 500,
    }
    answers = demo.post("/infill", json=completion).json()
    assert isinstance(answers, list) and len(answers) == 3  # n_cmpl: an array, as llama.cpp
    assert any(answer["content"].strip() for answer in answers)
    for answer in answers:
        # What its completion provider and status bar read.
        assert isinstance(answer["content"], str)
        assert answer["generation_settings"]["n_ctx"] == n_ctx
        timings = answer["timings"]
        for key in ("prompt_n", "prompt_ms", "prompt_per_second", "predicted_n", "predicted_ms"):
            assert key in timings, key
    # The warm-up's prompt (the other file's chunk) was reused, not computed again.
    assert answers[0]["tokens_cached"] > 0
    # Greedy, the line continues where the cursor is: the indentation was typed already.
    greedy = demo.post("/infill", json={**completion, "n_cmpl": 1, "temperature": 0}).json()
    first_line = greedy["content"].split("\n")[0]
    assert first_line.strip() and first_line == first_line.lstrip()


def test_continue_streams_its_own_fim_prompt_from_completion(demo):
    """Continue's llama.cpp provider, as it autocompletes with a StarCoder-style template; the
    cursor mid-line (a raw prompt is served as it is, so it is not healed)."""
    stops = [
        "<fim_prefix>",
        "<fim_suffix>",
        "<fim_middle>",
        "<file_sep>",
        "<|endoftext|>",
        "</fim_middle>",
        "</code>",
        "/src/",
        "#- coding: utf-8",
        "```",
    ]
    body = {
        "model": "starcoder2:3b",
        "prompt": f"<fim_prefix>{PREFIX}        result.append(<fim_suffix>{SUFFIX}<fim_middle>",
        "stream": True,
        "n_predict": 4096,
        "stop": stops,
        "temperature": 0.01,
    }
    headers = {"Content-Type": "application/json", "Authorization": "Bearer undefined"}
    with demo.stream("POST", "/completion", json=body, headers=headers) as response:
        assert response.status_code == 200
        lines = list(response.iter_lines())
    chunks = [json.loads(line[len("data: ") :]) for line in lines if line.startswith("data: ")]
    assert not any("error" in c for c in chunks)
    text = "".join(c["content"] for c in chunks)  # all Continue reads
    assert text.strip() and not any(stop in text for stop in stops)
    # It ended by itself, far from n_predict.
    assert chunks[-1]["stop"] is True and chunks[-1]["stop_type"] in ("eos", "word")
