from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, NoReturn

import httpx
import pytest


def complete(http: httpx.Client, **body: Any) -> dict[str, Any]:
    response = http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def texts(result: dict[str, Any]) -> list[str]:
    return [c["text"] for c in sorted(result["choices"], key=lambda c: c["index"])]


def stream_chunks(
    http: httpx.Client,
    path: str = "/v1/completions",
    *,
    into: list | None = None,
    leave: threading.Event | None = None,
    **body: Any,
) -> list[dict[str, Any] | str]:
    """Every SSE data payload of a streamed completion (or chat, by `path`), parsed; '[DONE]'
    kept as a string. `into`: the list they are appended to as they come; `leave`: once set,
    the client disconnects after the next payload."""
    chunks: list[dict[str, Any] | str] = [] if into is None else into
    with http.stream("POST", path, json={**body, "stream": True}) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data: "):
                payload = line[len("data: ") :]
                chunks.append(payload if payload == "[DONE]" else json.loads(payload))
                if leave is not None and leave.is_set():
                    break
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
    # OpenAI's four fields; a context error adds llama.cpp's numbers.
    assert set(body["error"]) - {"n_prompt_tokens", "n_ctx"} == {"message", "type", "param", "code"}
    assert body["error"]["message"]
    return body["error"]


def start_serve(*args: str, **popen: Any) -> subprocess.Popen:
    """`mlxserve serve ARGS` as a user starts it, in a subprocess whose output is captured."""
    return subprocess.Popen(
        [sys.executable, "-m", "mlxserve", "serve", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )


def wait_healthy(url: str, timeout: float = 600) -> None:
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


def wait_until(condition: Callable[[], bool], timeout: float = 60.0) -> bool:
    """Poll `condition` until it holds or `timeout` passes; whether it held."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


class BatchSizes:
    """The batch sizes an engine runs while the block runs, sampled every 2 ms from its
    `active_sequences` by a thread of its own. (`stats.peak_batch` is the largest since the
    server started: other tests' batches count in it.)"""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.seen: list[int] = []
        self._done = threading.Event()
        self._watcher = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._done.is_set():
            self.seen.append(self.engine.stats.active_sequences)
            time.sleep(0.002)

    def __enter__(self) -> BatchSizes:
        self._watcher.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._watcher.join()

    @property
    def largest(self) -> int:
        return max(self.seen, default=0)


class BackgroundStream:
    """A streamed completion read to its end on a thread of its own, from construction: its SSE
    payloads (as stream_chunks) and the seconds from the request to its last byte."""

    def __init__(self, url: str, body: dict[str, Any]) -> None:
        self.chunks: list[dict[str, Any] | str] = []
        self.elapsed_s = 0.0
        self._error: BaseException | None = None
        self._leave = threading.Event()
        self._thread = threading.Thread(target=self._read, args=(url, body), daemon=True)
        self._thread.start()

    def _read(self, url: str, body: dict[str, Any]) -> None:
        started = time.monotonic()
        try:
            with httpx.Client(base_url=url, timeout=None) as http:
                stream_chunks(http, into=self.chunks, leave=self._leave, **body)
        except BaseException as error:  # raised again in the test, by join
            self._error = error
        self.elapsed_s = time.monotonic() - started

    def leave(self) -> BackgroundStream:
        """The client disconnects (at its next payload); joined."""
        self._leave.set()
        return self.join()

    def join(self, timeout: float = 280) -> BackgroundStream:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"the stream still runs after {timeout} s"
        if self._error is not None:
            raise self._error
        return self


def skip_for_missing(reason: str) -> NoReturn:
    """Skip for want of something the project's own files install (a Debian package from
    scripts/install_system_packages.sh, a pip package from pyproject.toml). Under .ci/run
    (MLXSERVE_CI=1) such a skip means CI did not install it: the test fails instead."""
    if os.environ.get("MLXSERVE_CI") == "1":
        pytest.fail(f"{reason}; .ci/run installs it, so CI must not skip this", pytrace=False)
    pytest.skip(reason)
