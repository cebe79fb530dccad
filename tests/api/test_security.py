"""Secure by default: the API key from a flag, the environment or a file; CORS off unless
origins are allowed by flag; a stopping server drains its requests and exits 0."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time

import httpx
import pytest

from mlxserve.cli import main
from mlxserve.flag_values import read_api_key

from ..helpers import error_of, start_serve, wait_healthy
from ..live_server import free_port

# The HTTP contract alone: the platform policy does not change it (not in the portable pass).
pytestmark = pytest.mark.http_only

ORIGIN = "http://localhost:3000"


def test_the_api_key_comes_from_the_flag_first_then_the_file(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text("from-file\n# a comment line is ignored\n")
    assert read_api_key("from-flag", str(key_file)) == "from-flag"
    assert read_api_key(None, str(key_file)) == "from-file"
    assert read_api_key(None, None) is None


@pytest.mark.parametrize("content", [None, "", "\n"])
def test_a_missing_or_empty_key_file_stops_serve_before_it_starts(tmp_path, capsys, content):
    key_file = tmp_path / "key"
    if content is not None:
        key_file.write_text(content)
    assert main(["serve", "--api-key-file", str(key_file)]) == 2
    error = capsys.readouterr().err
    assert "API key file" in error and "Traceback" not in error


def test_cors_is_off_by_default(http):
    preflight = http.options(
        "/v1/completions",
        headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST"},
    )
    assert "access-control-allow-origin" not in preflight.headers


@pytest.mark.parametrize(
    ("content", "content_type"),
    [
        # What a page on another site can send without a preflight, and what it can't.
        ('{"prompt": "x", "max_tokens": 1}', "text/plain"),
        ('{"prompt": "x", "max_tokens": 1}', "application/x-www-form-urlencoded"),
        ('{"prompt": "x", "max_tokens": 1}', "application/json"),
    ],
)
def test_web_pages_of_other_origins_cannot_drive_the_server(server, http, content, content_type):
    generated = server.engine.stats.generated_tokens
    headers = {"Origin": "http://evil.example", "Content-Type": content_type}
    response = http.post("/v1/completions", content=content, headers=headers)
    error = error_of(response, 403)
    assert error["code"] == "origin_not_allowed" and "--cors-origin" in error["message"]
    assert "access-control-allow-origin" not in response.headers
    assert server.engine.stats.generated_tokens == generated
    error_of(http.post("/admin/unload", headers={"Origin": "http://evil.example"}), 403)
    assert server.engine.state == "ready"
    # Our own page (/docs' "Try it out") and clients that send no Origin are served.
    same = {"Origin": server.url, "Content-Type": content_type}
    assert http.post("/v1/completions", content=content, headers=same).status_code == 200
    plain = http.post("/v1/completions", content=content, headers={"Content-Type": content_type})
    assert plain.status_code == 200


def test_cors_allows_only_the_origins_given(live_server, tiny_model):
    live = live_server(tiny_model, cors_origins=(ORIGIN,), api_key="k")
    with httpx.Client(base_url=live.url, timeout=60) as http:
        # A browser's preflight carries no credentials: it must not need the key.
        preflight = http.options(
            "/v1/completions",
            headers={
                "Origin": ORIGIN,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization, content-type",
            },
        )
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == ORIGIN
        assert "authorization" in preflight.headers["access-control-allow-headers"].lower()
        body = {"prompt": "x", "max_tokens": 1}
        allowed = http.post(
            "/v1/completions",
            json=body,
            headers={"Origin": ORIGIN, "Authorization": "Bearer k"},
        )
        assert allowed.status_code == 200
        assert allowed.headers["access-control-allow-origin"] == ORIGIN
        assert allowed.headers["access-control-allow-credentials"] == "true"  # as llama.cpp
        other = http.post(
            "/v1/completions",
            json=body,
            headers={"Origin": "http://evil.example", "Authorization": "Bearer k"},
        )
        assert other.status_code == 403
        assert "access-control-allow-origin" not in other.headers
        # The key is still required on the real request.
        error_of(http.post("/v1/completions", json=body, headers={"Origin": ORIGIN}), 401)


def test_the_openapi_document_names_the_key_when_one_is_set(live_server, tiny_model):
    live = live_server(tiny_model, api_key="k")
    headers = {"Authorization": "Bearer k"}
    document = httpx.get(live.url + "/openapi.json", headers=headers, timeout=60).json()
    assert document["components"]["securitySchemes"]["apiKey"]["scheme"] == "bearer"
    assert document["security"] == [{"apiKey": []}]


def serve(model, *args: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    process = start_serve(
        "--model",
        str(model),
        "--port",
        str(port),
        *args,
        env={**os.environ, "MLXSERVE_API_KEY": ""},
    )
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url)
    return process, url


@pytest.mark.timeout(900)  # 8 streams of 1,000 tokens drained: minutes on a loaded CI machine
def test_sigterm_drains_requests_in_flight_then_exits_0(tiny_model, tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text("file-key\n")
    process, url = serve(tiny_model, "--api-key-file", str(key_file), "--drain-timeout", "600")
    headers = {"Authorization": "Bearer file-key"}
    try:
        # the file's key is required
        assert httpx.get(url + "/v1/models", timeout=60).status_code == 401
        body = {"prompt": "x", "max_tokens": 1000, "ignore_eos": True, "stream": True, "n": 8}
        chunks: list[str] = []

        def read_stream() -> None:
            with httpx.stream(
                "POST", url + "/v1/completions", json=body, headers=headers, timeout=120
            ) as response:
                # SSE lines end at "\n" only: httpx's iter_lines also splits at U+2028 and
                # friends, which a sampled random model's text may hold (raw, in JSON)
                pending = ""
                for text in response.iter_text():
                    *lines, pending = (pending + text).split("\n")
                    chunks.extend(line[6:] for line in lines if line.startswith("data: "))

        reader = threading.Thread(target=read_stream)
        reader.start()
        while len(chunks) < 4:
            time.sleep(0.01)
        process.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        refused = httpx.post(
            url + "/v1/completions",
            json={"prompt": "x", "max_tokens": 1},
            headers=headers,
            timeout=60,
        )
        assert error_of(refused, 503)["code"] == "shutting_down"
        assert refused.headers["Retry-After"]
        reader.join(600)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=600)
    assert process.returncode == 0, stderr
    assert chunks[-1] == "[DONE]"
    events = [json.loads(c) for c in chunks[:-1]]
    finished = [c["choices"][0] for c in events if c["choices"][0]["finish_reason"]]
    assert len(finished) == 8 and {c["finish_reason"] for c in finished} == {"length"}
    assert sum(len(c["choices"][0]["text"]) for c in events) > 0
    assert "Traceback" not in stderr


def test_a_drain_deadline_ends_what_is_left_with_503_and_still_exits_0(tiny_model):
    process, url = serve(tiny_model, "--drain-timeout", "0.5")
    payloads: list[str] = []
    try:
        body = {"prompt": "x", "max_tokens": 1900, "ignore_eos": True, "stream": True, "n": 16}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    payloads.append(line[6:])
                    if len(payloads) == 1:
                        process.send_signal(signal.SIGTERM)
                        started = time.monotonic()
        ended = time.monotonic() - started
    finally:
        if process.poll() is None and not payloads:
            process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    last = json.loads(payloads[-1])
    assert last["error"]["type"] == "service_unavailable", last
    assert "shutting down" in last["error"]["message"]
    assert ended < 10
    assert "stopping with" in stderr and "unfinished" in stderr
