from __future__ import annotations

import json
import time
from typing import Any

import httpx


def complete(http: httpx.Client, **body: Any) -> dict[str, Any]:
    response = http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def texts(result: dict[str, Any]) -> list[str]:
    return [c["text"] for c in sorted(result["choices"], key=lambda c: c["index"])]


def stream_chunks(http: httpx.Client, **body: Any) -> list[dict[str, Any] | str]:
    """Every SSE data payload of a streamed completion, parsed; '[DONE]' kept as a string."""
    chunks: list[dict[str, Any] | str] = []
    with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data: "):
                payload = line[len("data: ") :]
                chunks.append(payload if payload == "[DONE]" else json.loads(payload))
    return chunks


def streamed_texts(chunks: list) -> dict[int, str]:
    out: dict[int, str] = {}
    for chunk in chunks:
        if isinstance(chunk, dict):
            for choice in chunk["choices"]:
                out[choice["index"]] = out.get(choice["index"], "") + choice["text"]
    return out


def error_of(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, (response.status_code, response.text)
    body = response.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["error"]["message"]
    return body["error"]


def wait_healthy(url: str, timeout: float = 90) -> None:
    """Poll a server started in another process until /health says 200."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} never became healthy")
