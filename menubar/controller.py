"""The menubar app's logic, with no UI toolkit in it: start, watch and stop an `mlxserve serve`
process over HTTP, and load, unload and pin the models it serves. The UIs (rumps on macOS, Tk
elsewhere) only render the `Snapshot` this controller publishes and call its methods.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import httpx
import platformdirs

State = Literal["stopped", "starting", "loading", "ready", "error"]
LOG_TAIL_LINES = 20
POLL_TIMEOUT_S = 5.0
# A load waits on the server for room (an idle model's unload) and for an adapter's base.
ADMIN_TIMEOUT_S = 180.0


@dataclass(frozen=True)
class ModelChoice:
    """One model the menu lists: a served one with its engine's facts (/admin/status), or one
    on disk the server could load (/v1/models)."""

    name: str
    loaded: bool
    size_bytes: int | None = None
    state: str | None = None  # starting, loading, ready, unloaded, error, stopped; None: not served
    default: bool = False
    pinned: bool = False
    memory_bytes: int = 0
    queue: int = 0
    base_model: str | None = None  # a LoRA adapter's base
    error: str | None = None
    kind: str = "generate"  # or "embed", "rerank" (/v1/models): never the default
    vision: bool = False  # it takes images (/v1/models)


@dataclass(frozen=True)
class Snapshot:
    """Everything the menu shows, at one moment."""

    state: State = "stopped"
    url: str = ""
    model: str | None = None
    models: tuple[ModelChoice, ...] = ()
    tokens_per_second: float = 0.0
    queue: int = 0
    error: str | None = None
    log_tail: str = ""
    attached: bool = False  # a server this app did not start (found on the port)
    memory_budget_bytes: int = 0  # what the served models' weights may take together
    models_memory_bytes: int = 0  # ... and what they take


@dataclass(frozen=True)
class PortConflict:
    """The port is taken: by an mlxserve (`mlxserve` true: offer to use it) or by something
    else (offer `free_port`)."""

    port: int
    mlxserve: bool
    free_port: int


class ServerController:
    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 8080,
        serve_args: Sequence[str] = (),
        api_key: str | None = None,
        log_path: Path | None = None,
        python: str = sys.executable,
    ):
        """`serve_args`: more flags for `mlxserve serve` (--model, --models-dir, ...)."""
        self.host, self.port = host, port
        self.serve_args = list(serve_args)
        self.api_key = api_key
        self.log_path = log_path or Path(platformdirs.user_log_dir("mlxserve")) / "server.log"
        self.python = python
        self.process: subprocess.Popen | None = None
        self.snapshot = Snapshot(url=self.url)
        self._listeners: list[Callable[[Snapshot], None]] = []
        self._lock = threading.Lock()
        self._polling: threading.Thread | None = None
        self._stop_polling = threading.Event()
        self._action_error: str | None = None  # the last model action's failure, until the next

    # ---- what the UI calls ------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def on_change(self, listener: Callable[[Snapshot], None]) -> None:
        self._listeners.append(listener)

    def port_conflict(self) -> PortConflict | None:
        """Whether something already listens on the port, and what (call before `start`)."""
        if not _port_taken(self.host, self.port):
            return None
        return PortConflict(self.port, self._is_mlxserve(), _free_port(self.host))

    def start(self) -> None:
        """Start `mlxserve serve` (a no-op while one runs)."""
        if self.process is not None and self.process.poll() is None:
            return
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        command = [self.python, "-m", "mlxserve", "serve", "--host", self.host,
                   "--port", str(self.port), *self.serve_args]  # fmt: skip
        env = dict(os.environ)
        if self.api_key:
            env["MLXSERVE_API_KEY"] = self.api_key
        self.process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        log.close()
        self._action_error = None
        self._publish(Snapshot(state="starting", url=self.url))

    def attach(self, port: int | None = None) -> None:
        """Use a server already running (on `port`, default ours) instead of starting one."""
        if port is not None:
            self.port = port
        self.process = None
        self._action_error = None
        self._publish(Snapshot(state="starting", url=self.url, attached=True))
        self.refresh()

    def use_port(self, port: int) -> None:
        self.port = port
        self._publish(replace(self.snapshot, url=self.url))

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM (the server drains), then SIGKILL after `timeout`; the port is then free."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._action_error = None
        self._publish(Snapshot(state="stopped", url=self.url))

    def load(self, model: str) -> bool:
        """Load a known model beside the served ones (POST /admin/load); it becomes the default
        once ready, and one already loaded becomes the default at once. Progress shows in the
        snapshots; False (the message in the snapshot's error) when the server refuses."""
        return self._admin("/admin/load", {"model": model})

    def unload(self, model: str) -> bool:
        """Free a served model's memory once its requests end (POST /admin/unload)."""
        return self._admin("/admin/unload", {"model": model})

    def pin(self, model: str, pinned: bool = True) -> bool:
        """Keep a model in memory whatever else is loaded, or not (POST /admin/pin)."""
        return self._admin("/admin/pin", {"model": model, "pinned": pinned})

    def refresh(self) -> Snapshot:
        """Poll the server once and publish what it says."""
        snapshot = self._read_state()
        self._publish(snapshot)
        return snapshot

    def start_polling(self, interval: float = 1.0) -> None:
        """Refresh every `interval` seconds in a background thread until `stop_polling`."""
        self._stop_polling.clear()

        def loop() -> None:
            while not self._stop_polling.wait(interval):
                if self.snapshot.state != "stopped" or self.snapshot.attached:
                    self.refresh()

        self._polling = threading.Thread(target=loop, name="mlxserve-menubar-poll", daemon=True)
        self._polling.start()

    def stop_polling(self) -> None:
        self._stop_polling.set()

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    # ---- internals --------------------------------------------------------------------------

    def _read_state(self) -> Snapshot:
        base = Snapshot(url=self.url, attached=self.snapshot.attached)
        if self.process is None and not self.snapshot.attached:
            return replace(base, state="stopped")
        if self.process is not None and self.process.poll() is not None:
            code = self.process.returncode
            return replace(
                base,
                state="error",
                error=f"the server exited with code {code}",
                log_tail=self.log_tail(),
            )
        try:
            health = self._http("GET", "/health")
        except httpx.TransportError:
            if self.snapshot.attached:
                return replace(base, state="error", error=f"no server answers at {self.url}")
            return replace(base, state="starting")
        if health.status_code == 503 and self.snapshot.state in ("starting", "stopped"):
            return replace(base, state="loading")
        try:
            status = self._http("GET", "/admin/status").json()
            models = self._http("GET", "/v1/models").json().get("data", [])
        except (httpx.TransportError, ValueError):
            return replace(base, state="starting")
        server_state = status.get("state")
        state: State = "ready" if server_state in ("ready", "unloaded") else "loading"
        if server_state == "error":
            state = "error"
        return replace(
            base,
            state=state,
            model=status.get("model"),
            models=model_choices(status, models),
            tokens_per_second=float(status.get("tokens_per_second") or 0.0),
            queue=int(status.get("pending_sequences") or 0),
            error=self._action_error or status.get("load_error") or status.get("error"),
            memory_budget_bytes=int(status.get("memory_budget_bytes") or 0),
            models_memory_bytes=int(status.get("models_memory_bytes") or 0),
        )

    def _admin(self, path: str, body: dict) -> bool:
        """POST an admin request; a failure is not raised but kept as the snapshot's error until
        the next action (the UIs call this from a menu click)."""
        try:
            response = self._http("POST", path, json=body, timeout=ADMIN_TIMEOUT_S)
        except httpx.HTTPError as error:
            message = f"no answer from {self.url}: {error}"
        else:
            message = _error_message(response) if response.status_code >= 400 else None
        self._action_error = message
        if message is not None:
            self._publish(replace(self.snapshot, error=message))
            return False
        self.refresh()
        return True

    def _publish(self, snapshot: Snapshot) -> None:
        with self._lock:
            changed = snapshot != self.snapshot
            self.snapshot = snapshot
        if changed:
            for listener in self._listeners:
                listener(snapshot)

    def _http(
        self, method: str, path: str, timeout: float = POLL_TIMEOUT_S, **kwargs
    ) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        return httpx.request(method, self.url + path, headers=headers, timeout=timeout, **kwargs)

    def _is_mlxserve(self) -> bool:
        try:
            body = self._http("GET", "/health").json()
        except (httpx.HTTPError, ValueError):
            return False
        return isinstance(body, dict) and ("model" in body or body.get("status") == "loading")


def model_choices(status: dict, cards: list[dict]) -> tuple[ModelChoice, ...]:
    """Every model the server knows, in /v1/models' order (the default, the other served ones,
    then the rest on disk; aliases left out), each served one with its /admin/status facts."""
    served = {m["model"]: m for m in status.get("models") or [] if m.get("model")}
    choices = {}
    for card in cards:
        name = card.get("id")
        if not name or "alias_of" in card or name in choices:
            continue
        choices[name] = _choice(name, card, served.get(name), status.get("model"))
    for name, facts in served.items():
        if name not in choices:
            choices[name] = _choice(name, {}, facts, status.get("model"))
    return tuple(choices.values())


def _choice(name: str, card: dict, facts: dict | None, default: str | None) -> ModelChoice:
    size = card.get("size_bytes")
    if facts is None:  # not served (or a server that reports no per-model status): the card
        return ModelChoice(
            name,
            bool(card.get("loaded")),
            size,
            state=card.get("status"),
            default=bool(card.get("default", name == default)),
            pinned=bool(card.get("pinned")),
            memory_bytes=int(card.get("memory_bytes") or 0),
            kind=card.get("kind") or "generate",
            vision=bool(card.get("vision")),
        )
    memory = int(facts.get("memory_bytes") or 0)
    state = facts.get("state")
    return ModelChoice(
        name,
        memory > 0,
        size,
        state=state,
        default=bool(facts.get("default")),
        pinned=bool(facts.get("pinned")),
        memory_bytes=memory,
        queue=int(facts.get("pending_sequences") or 0),
        base_model=facts.get("base_model"),
        error=facts.get("load_error") or facts.get("error"),
        kind=card.get("kind") or "generate",
        vision=bool(card.get("vision")),
    )


def _error_message(response: httpx.Response) -> str:
    """The message of the server's {"error": {"message"}} body, else its text."""
    try:
        error = response.json().get("error")
    except (ValueError, AttributeError):
        error = None
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])
    return response.text.strip() or f"HTTP {response.status_code}"


def _port_taken(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_until(controller: ServerController, states: set[str], timeout: float = 60.0) -> Snapshot:
    """Refresh until the state is one of `states` (for scripts and tests)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        snapshot = controller.refresh()
        if snapshot.state in states:
            return snapshot
        time.sleep(0.1)
    raise TimeoutError(f"still {controller.snapshot.state} after {timeout:.0f} s")
