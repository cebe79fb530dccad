"""Ollama clients' own request sequences, replayed on a real server with their exact bodies and
headers: Raycast's Ollama extension starting a chat (raycast/extensions,
extensions/raycast-ollama/src/lib/ollama/ollama.ts) and Continue's ollama provider asking for
an autocompletion (continuedev/continue, core/llm/llms/Ollama.ts)."""

from __future__ import annotations

import json
import re
import time
from datetime import datetime

import httpx
import pytest


@pytest.fixture
def coder(live_server, tiny_coder):
    return live_server(tiny_coder)


def ndjson(response: httpx.Response) -> list[dict]:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/x-ndjson")
    return [json.loads(line) for line in response.text.splitlines() if line.strip()]


def raycast_parameter(parameters: list[str], name: str, default: float) -> float:
    """How the extension reads one Modelfile parameter from /api/show's `parameters`."""
    found = [re.match(rf"^{name}[ \t]+(.*)", p) for p in parameters]
    values = [m.group(1) for m in found if m]
    return float(values[0]) if values else default


def test_raycast_starts_a_streamed_chat(coder):
    """Version, tags, show (its `parameters` become the chat's options), then the chat, POSTed
    without a Content-Type (Node's fetch sends a string body as text/plain)."""
    with httpx.Client(base_url=coder.url, timeout=60) as http:
        assert http.get("/api/version").json()["version"]
        tags = http.get("/api/tags").json()["models"]
        model = tags[0]["name"]
        assert {"name", "modified_at", "size", "digest", "details"} <= set(tags[0])
        shown = http.post(
            "/api/show", headers={"Content-Type": "application/json"}, json={"name": model}
        ).json()
        parameters = shown["parameters"].split("\n") if shown["parameters"] else []
        num_ctx = raycast_parameter(parameters, "num_ctx", 2048)
        assert num_ctx == coder.engine.loaded.context_length
        options = {
            "mirostat": 0,
            "mirostat_eta": 0.1,
            "mirostat_tau": 5.0,
            "num_ctx": int(num_ctx),
            "num_gpu": 1,
            "repeat_last_n": 64,
            "repeat_penalty": 1.1,
            "temperature": 0.8,
            "seed": 0,
            "stop": [],
            "tfs_z": 1,
            "num_predict": 24,
            "top_k": 40,
            "top_p": 0.9,
        }
        body = {
            "model": model,
            "messages": [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "Write a haiku about the sea."},
            ],
            "stream": True,
            "keep_alive": "5m",
            "options": options,
        }
        lines = ndjson(http.post("/api/chat", content=json.dumps(body)))
    *pieces, final = lines
    assert pieces and all(not p["done"] and p["message"]["role"] == "assistant" for p in pieces)
    assert "".join(p["message"]["content"] for p in pieces)
    assert final["done"] and final["done_reason"] == "length" and final["eval_count"] == 24
    assert final["model"] == model


def test_continue_autocompletes_through_generate_with_a_suffix(coder):
    """Continue reads /api/show's template for `.Suffix` to know it may send one; its FIM
    request is raw, streamed, with its stop words and a keep_alive in seconds."""
    prefix = "def fibonacci(n):\n    "
    suffix = "\n\nprint(fibonacci(10))\n"
    with httpx.Client(base_url=coder.url, timeout=60) as http:
        model = coder.engine.model_name
        shown = http.post(
            "/api/show", headers={"Content-Type": "application/json"}, json={"name": model}
        ).json()
        assert ".Suffix" in shown["template"]  # Continue's fimSupported
        for line in shown["parameters"].split("\n"):
            assert re.match(r"^(\S+)\s+((?:\".*\")|\S+)$", line), line  # its parser's pattern
        stop = ["<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<|endoftext|>", "\n\n", "```"]
        body = {
            "model": model,
            "prompt": prefix,
            "suffix": suffix,
            "raw": True,
            "options": {"temperature": 0.01, "num_predict": 48, "stop": stop, "num_ctx": 8192},
            "keep_alive": 1800,
            "stream": True,
        }
        started = time.time()
        lines = ndjson(
            http.post("/api/generate", headers={"Content-Type": "application/json"}, json=body)
        )
        *pieces, final = lines
        text = "".join(p["response"] for p in pieces)
        assert final["done"] and final["response"] == ""
        assert not any(word in text for word in stop)
        # The prompt was the model's FIM prompt around the cursor, as /v1/completions builds it.
        fim = http.post(
            "/v1/completions", json={"prompt": prefix, "suffix": suffix, "max_tokens": 1}
        ).json()
        assert final["prompt_eval_count"] == fim["usage"]["prompt_tokens"]
        expires = http.get("/api/ps").json()["models"][0]["expires_at"]
    assert abs(datetime.fromisoformat(expires).timestamp() - started - 1800) < 60
