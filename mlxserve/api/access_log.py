"""The access log ("mlxserve.access"): one INFO line per request (polls that succeed: DEBUG),
written when its response has gone out (a stream's when it ends): who asked, what, the status,
how long it took, and for a generation its token counts. At DEBUG, each request's headers (the
API key never) and its JSON body, cut short.

The line is kept in a context variable for the request's task, which also sends the response:
a stream's generator runs there after the request context has closed, and still finds it.
"""

from __future__ import annotations

import logging
import time
from contextvars import ContextVar
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from quart import Quart, request
from quart.wrappers.response import IterableBody, ResponseBody

log = logging.getLogger("mlxserve.access")

SECRET_HEADERS = frozenset({"authorization", "x-api-key"})
MAX_LOGGED_BODY = 2000  # characters of a request body at DEBUG
# What clients poll (the menubar, health checks, Prometheus): logged at DEBUG when it succeeds,
# as llama.cpp leaves /health out of its log, so the INFO lines stay the requests' own.
POLLED_PATHS = frozenset({"/health", "/admin/status", "/metrics"})


@dataclass
class Entry:
    """One request's line, filled in as the request goes."""

    client: str
    method: str
    path: str
    agent: str
    started: float
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    drafts: tuple[int, int] = (0, 0)  # tokens drafted and verified, and kept

    def write(self, status: int, cut: bool = False) -> None:
        parts = [
            f'{self.client} "{self.method} {self.path}" {status}',
            f"{time.perf_counter() - self.started:.3f}s",
        ]
        if self.prompt_tokens is not None:
            parts.append(
                f"prompt_tokens={self.prompt_tokens} completion_tokens={self.completion_tokens} "
                f"cached_tokens={self.cached_tokens}"
            )
        if self.drafts[0]:
            parts.append(f"draft_tokens={self.drafts[0]} draft_accepted={self.drafts[1]}")
        if cut:
            parts.append("stream cut short")
        parts.append(f'"{self.agent}"')
        polled = self.method == "GET" and self.path in POLLED_PATHS and status < 400
        log.log(logging.DEBUG if polled else logging.INFO, " ".join(parts))


_entry: ContextVar[Entry | None] = ContextVar("mlxserve_access_entry", default=None)


def install(app: Quart) -> None:
    """Before any other hook, so that a request refused by one (401) is logged too."""

    @app.before_request
    async def open_entry() -> None:
        _entry.set(
            Entry(
                client=request.remote_addr or "-",
                method=request.method,
                path=request.path,
                agent=request.headers.get("User-Agent", "-"),
                started=time.perf_counter(),
            )
        )
        if log.isEnabledFor(logging.DEBUG):
            headers = {
                name: "<redacted>" if name.lower() in SECRET_HEADERS else value
                for name, value in request.headers.items()
            }
            log.debug("%s %s headers: %s", request.method, request.path, headers)

    @app.after_request
    async def close_entry(response):
        entry = _entry.get()
        if entry is None:
            return response
        if isinstance(response.response, IterableBody):
            response.response = _LoggedStream(response.response, entry, response.status_code)
        else:
            entry.write(response.status_code)
        return response


def note_tokens(
    prompt_tokens: int, completion_tokens: int, cached_tokens: int, drafts: tuple[int, int]
) -> None:
    """This request's token counts, for its line (a no-op outside a request); `drafts`:
    speculative decoding's tokens drafted and verified, and kept."""
    entry = _entry.get()
    if entry is not None:
        entry.prompt_tokens = prompt_tokens
        entry.completion_tokens = completion_tokens
        entry.cached_tokens = cached_tokens
        entry.drafts = drafts


def note_body(body: bytes) -> None:
    """A JSON request body, at DEBUG, cut at MAX_LOGGED_BODY characters."""
    if log.isEnabledFor(logging.DEBUG):
        text = body.decode("utf-8", errors="replace")
        if len(text) > MAX_LOGGED_BODY:
            text = f"{text[:MAX_LOGGED_BODY]}... ({len(text)} characters)"
        log.debug("%s %s body: %s", request.method, request.path, text)


class _LoggedStream(ResponseBody):
    """A streamed body that writes the request's line once the stream has ended, or was cut
    (the client went away: the task sending it is cancelled)."""

    def __init__(self, body: IterableBody, entry: Entry, status: int) -> None:
        self.body = body
        self.entry = entry
        self.status = status

    async def __aenter__(self) -> Any:
        return await self.body.__aenter__()

    async def __aexit__(
        self, exc_type: type | None, exc_value: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            await self.body.__aexit__(exc_type, exc_value, tb)  # the generator's `finally`s run
        finally:
            self.entry.write(self.status, cut=exc_type is not None)

    def __aiter__(self) -> Any:
        return self.body.__aiter__()
